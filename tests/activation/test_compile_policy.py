"""``activation.budget.compile_policy``: the compiled plan's save sets, recorded on fake tensors, fit their budget
(checked against the step's segments independently of the planner's own arithmetic), are the same on every run,
and a budget below the minimum is refused with the fix; the policy torch runs saves exactly the planned ops. One
slow test compiles a micro GPT per block under a plan and checks the allocator's peak and the gradients."""

from __future__ import annotations

import functools
import types
from collections import Counter

import pytest
import torch

from pytest_flashckpt.activation.budget import BudgetTooSmall, MeasuredCosts
from pytest_flashckpt.activation.budget.compile_policy import (
    SavePolicy,
    _decide,
    block_menu,
    compile_blocks,
    plan_compiled,
    policy_contexts,
    record_block_ops,
)
from pytest_flashckpt.activation.options import FULL, NONE
from pytest_flashckpt.models import GPTConfig, build_model
from pytest_flashckpt.models.anatomy import get_blocks
from pytest_flashckpt.training import Trainer

SHAPE = (2, 32)
ADDMM = torch.ops.aten.addmm.default


def micro(dropout: float = 0.0) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=64, n_layer=3, n_head=2, n_embd=32, dropout=dropout)


@pytest.fixture(scope="module")
def model():
    return build_model(micro(), "sdpa")


@pytest.fixture(scope="module")
def source(model):
    """The step's none / full segments under the exact cpu probe (a micro step: milliseconds)."""
    return MeasuredCosts(model, (NONE, FULL), pointwise_weight=128.0)


def test_ops_are_read_off_the_forward_with_what_the_backward_keeps(model):
    ops = record_block_ops(model, *SHAPE)
    assert len(ops) == 3 and ops[0].signature() == ops[1].signature() == ops[2].signature()
    by_label = {op.label: op for op in ops[0].ops}
    fc = by_label["addmm#2"]  # mlp.c_fc: its output is what GeLU's backward reads
    assert fc.candidate and fc.bytes == SHAPE[0] * SHAPE[1] * 4 * 32 * 4 and fc.flops == 2 * 64 * 32 * 128
    assert not by_label["addmm#1"].saved_for_backward  # attn.c_proj: the residual add's backward never reads it
    assert not by_label["addmm#3"].candidate  # nor mlp.c_proj's
    assert by_label["gelu#0"].pointwise == SHAPE[0] * SHAPE[1] * 128


def test_random_ops_are_never_candidates():
    ops = record_block_ops(build_model(micro(dropout=0.1), "sdpa"), *SHAPE)[0].ops
    random_ops = [op for op in ops if op.why_not.startswith("draws random numbers")]
    assert random_ops and not any(op.candidate for op in random_ops)
    # control: without dropout the attention kernel (tagged nondeterministic_seeded) is a candidate
    clean = record_block_ops(build_model(micro(), "sdpa"), *SHAPE)[0].ops
    assert not any(op.why_not for op in clean) and any("flash_attention" in op.label and op.candidate for op in clean)


def test_the_menu_is_a_pareto_front_from_full_to_nothing_recomputed(model):
    menu = block_menu(record_block_ops(model, *SHAPE)[0], pointwise_weight=128.0)
    assert menu.exact and menu.entries[0].policy == SavePolicy(frozenset()) and menu.entries[0].bytes == 0
    assert menu.entries[-1].cost == 0
    for smaller, larger in zip(menu.entries, menu.entries[1:]):
        assert smaller.bytes < larger.bytes and smaller.cost > larger.cost


@pytest.mark.parametrize("span", [0, 30, 60, 100])
def test_the_plan_fits_its_budget(model, source, span):
    plan = plan_compiled(model, f"min + {span}%", SHAPE, source)
    costs = source.costs(*SHAPE)
    entries = {e.policy: e for e in block_menu(record_block_ops(model, *SHAPE)[0], 128.0).entries}
    # the peak recomputed here from the step's none/full segments and the policies' own bytes, not the planner's
    none, full = costs.option_index(NONE), costs.option_index(FULL)
    peak, below = costs.before, 0
    for i, policy in enumerate(plan.policies):
        extra = 0 if policy is None else entries[policy].bytes
        kept = costs.kept[i][none] if policy is None else costs.kept[i][full] + extra
        reach = costs.reach[i][none] if policy is None else costs.reach[i][full] + extra
        peak, below = max(peak, below + reach), below + kept
    assert peak == plan.shape_plan.plan.predicted_peak <= plan.shape_plan.budget_bytes
    if span == 100:
        assert plan.shape_plan.plan.flops == 0  # the whole range is reachable: nothing recomputed at the top
    if span == 0:
        assert peak == plan.shape_plan.min_peak and plan.shape_plan.plan.flops > 0


def test_more_budget_never_recomputes_more(model, source):
    flops = [plan_compiled(model, f"min + {span}%", SHAPE, source).shape_plan.plan.flops for span in (0, 20, 40, 60, 80, 100)]
    assert flops == sorted(flops, reverse=True) and flops[0] > flops[-1]


def test_plans_are_deterministic(source):
    first = plan_compiled(build_model(micro(), "sdpa", seed=1), "min + 40%", SHAPE, source)
    again = plan_compiled(build_model(micro(), "sdpa", seed=2), "min + 40%", SHAPE, source)
    assert first.policies == again.policies and first.names == again.names


def test_a_budget_below_the_minimum_is_refused_with_the_fix(model, source):
    with pytest.raises(BudgetTooSmall, match=r"activation\.budget: 1\.0 KiB .* is below the smallest achievable peak "
                                             r".* at batch 2 x seq 32 .*raise activation\.budget to at least") as info:
        plan_compiled(model, "1 KiB", SHAPE, source)
    assert info.value.minimum == plan_compiled(model, "min", SHAPE, source).shape_plan.min_peak


def test_the_policy_saves_exactly_the_planned_occurrences():
    policy = SavePolicy(frozenset({("aten.addmm.default", 1)}))
    counts = Counter()
    forward, recompute = types.SimpleNamespace(is_recompute=False), types.SimpleNamespace(is_recompute=True)
    decisions = [_decide(policy, counts, forward, ADDMM).name for _ in range(3)]
    assert decisions == ["PREFER_RECOMPUTE", "MUST_SAVE", "PREFER_RECOMPUTE"]
    # the recomputation counts apart: its second addmm is the saved one too
    assert [_decide(policy, counts, recompute, ADDMM).name for _ in range(2)] == ["PREFER_RECOMPUTE", "MUST_SAVE"]


def test_an_eager_checkpoint_under_a_plan_gives_the_same_gradients(model, source):
    """Control for the compiled test below, eager (no compiler needed): the policies change what is kept, not the
    numbers."""
    plan = plan_compiled(model, "min + 50%", SHAPE, source)
    reference, planned = build_model(micro(), "sdpa"), build_model(micro(), "sdpa")
    blocks = get_blocks(planned)
    for block, policy in zip(blocks, plan.policies):
        if policy is not None:
            inner, context_fn = block.forward, functools.partial(policy_contexts, policy)
            block.forward = lambda *a, inner=inner, context_fn=context_fn: torch.utils.checkpoint.checkpoint(
                inner, *a, use_reentrant=False, context_fn=context_fn)
    x = torch.randint(0, 64, SHAPE)
    for m in (reference, planned):
        m(x, x).backward()
    for a, b in zip(reference.parameters(), planned.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def _compiler_missing() -> str | None:
    from pytest_flashckpt.probes.compiled import missing_compiler

    return missing_compiler()


COMPILED_SHAPE = (8, 64)  # 512 tokens: activations, not the weights, set the micro step's peak


@pytest.fixture(scope="module")
def compiled_run(source):
    """A micro GPT compiled per block under the plan at min + 50%, beside the same model eager: the first loss and
    gradients of each, then the compiled step's allocator reading after warm-up. Compiled once for both tests."""
    reason = _compiler_missing()
    if reason is not None:
        pytest.skip(reason)
    from pytest_flashckpt.probes.compiled import import_inductor, measure_compiled_step

    import_inductor()
    torch._dynamo.reset()
    try:
        plan = plan_compiled(build_model(micro(), "sdpa"), "min + 50%", COMPILED_SHAPE, source)
        eager = Trainer.create(build_model(micro(), "sdpa"), *COMPILED_SHAPE)
        compiled = Trainer.create(build_model(micro(), "sdpa"), *COMPILED_SHAPE)
        compile_blocks(compiled.model, plan.policies)
        first = []
        for trainer in (eager, compiled):
            x, y = trainer.batch(0)
            loss = trainer.model(x, y)
            loss.backward()
            first.append((loss.detach(), [p.grad.detach().clone() for p in trainer.model.parameters()]))
            trainer.optimizer.zero_grad(set_to_none=True)
        compiled.train_step()  # optimizer state exists from here on
        reading = measure_compiled_step(compiled.train_step, expected_regions=len(plan.policies))
        resident = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in compiled.state_tensors()}.values())
        yield types.SimpleNamespace(plan=plan, eager=first[0], compiled=first[1], reading=reading, peak=resident + reading.added_peak_bytes)
    finally:
        torch._dynamo.reset()


# Dynamo reads ``.grad`` of each block's input (a non-leaf activation) while tracing the checkpoint and hides the
# UserWarning that read raises itself, through ``warnings.showwarning`` (``torch._logging.hide_warnings(
# safe_grad_filter)`` in torch/_dynamo/variables/builder.py). An "error" filter raises before showwarning is
# reached, so under ``filterwarnings = error`` torch's own hidden warning fails the trace; only that message is
# let through, which is what torch does outside pytest.
TORCH_HIDDEN_GRAD_WARNING = "ignore:The .grad attribute of a Tensor that is not a leaf Tensor is being accessed:UserWarning"


@pytest.mark.filterwarnings(TORCH_HIDDEN_GRAD_WARNING)
@pytest.mark.slow  # compiles three blocks with Inductor (g++): 1-5 min on 2 shared cores
def test_compiled_blocks_under_a_plan_match_eager(compiled_run):
    assert any(p is not None for p in compiled_run.plan.policies)  # a real policy is compiled, not only none
    assert compiled_run.reading.compiled_regions == 3 and compiled_run.reading.new_graphs == 0
    (eager_loss, eager_grads), (loss, grads) = compiled_run.eager, compiled_run.compiled
    torch.testing.assert_close(loss, eager_loss, rtol=1e-4, atol=1e-5)  # torch._dynamo.testing.same's tolerance
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings(TORCH_HIDDEN_GRAD_WARNING)
@pytest.mark.xfail(strict=True, reason=(
    "known gap, measured: on this micro card the compiled step's allocator peak is above the plan's budget "
    "(3,555,368 B against 3,151,496 B at 8 x 64; 918,760 against 893,256 at 2 x 32): the prediction takes each "
    "block's reach from the eager step, and Inductor's compiled backward of a block holds more at once; on tiny and "
    "llama-tiny at 4 x 256 see reports/compile-plan-sweep.md. Strict: passing means the gap closed"))
@pytest.mark.slow
def test_compiled_blocks_hold_the_budget(compiled_run):
    assert compiled_run.peak <= compiled_run.plan.shape_plan.budget_bytes
