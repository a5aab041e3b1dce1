"""Compiling for real (slow: a cold per-block compile takes 5-60 s on 2 cores): a compiled step agrees with eager,
runs compiled (Dynamo's counters, the profiler's compiled regions), its peak is read from the allocator, and the
probe route would have run it eager; and one compiled scenario through the runner. Skipped with the reason where
no C++ compiler is found."""

from __future__ import annotations

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.activation.policy import UnlabelledMatmul
from pytest_flashckpt.config.scenario import ActivationConfig, Scenario
from pytest_flashckpt.config.typed import build
from pytest_flashckpt.models.anatomy import get_anatomy, get_blocks
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.runner import compiled
from pytest_flashckpt.runner.context import RunContext
from pytest_flashckpt.runner.run import run_scenario
from pytest_flashckpt.training import Trainer

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_dynamo():
    reason = compiled.compiler_missing()
    if reason is not None:
        pytest.skip(reason)
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    yield counters
    torch._dynamo.reset()


def _trainer(strategy: str) -> Trainer:
    model = build_model(load_card("llama-tiny"), "sdpa", torch.device("cpu"), torch.float32, seed=0)
    apply_ac(model, ActivationConfig(strategy=strategy))
    return Trainer.create(model, 2, 32, seed=0)


def _agrees_with_eager(eager: Trainer, trainer: Trainer) -> None:
    """One forward + backward of both on batch 0: the compiled loss and gradients equal eager's within float32
    reordering (compile reorders float sums)."""
    x, y = eager.batch(0)

    def loss_and_grads(side: Trainer):
        loss = side.model(x, y)
        loss.backward()
        grads = [p.grad.clone() for p in side.model.parameters()]
        side.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), grads

    (want_loss, want_grads), (loss, grads) = loss_and_grads(eager), compiled.torch_hidden_warning(lambda: loss_and_grads(trainer))()
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_block_compiled_selective_op_step_agrees_with_eager_and_runs_compiled(fresh_dynamo):
    counters = fresh_dynamo
    eager, trainer = _trainer("selective_op"), _trainer("selective_op")
    config = build(Scenario, {"name": "s", "compile": {"scope": "block"}}, "t.yaml").compile
    regions = compiled.compile_model(trainer.model, config)
    assert regions == len(get_blocks(trainer.model, get_anatomy(trainer.model)))
    _agrees_with_eager(eager, trainer)
    assert counters["frames"]["ok"] >= 1 and not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 1  # every block shares one graph (no guard on the block's name)

    step = compiled.torch_hidden_warning(trainer.train_step)
    step()  # optimizer state exists from here on
    reading = compiled.read_step(step)
    assert reading.compiled_regions == regions and reading.added_peak_bytes > 0

    # control: the probe route. Under the cpu probe (a TorchDispatchMode) Dynamo runs the blocks eager, where a
    # compiled block has no role hooks, so the policy cannot read a role: the eager fallback is an error, not a row.
    # Dynamo keeps skipping those frames after the probe, so the next step outside it fails the same way.
    with pytest.raises(UnlabelledMatmul, match="outside every projection"):
        with LiveTensorProbe().track(resident=trainer.state_tensors()):
            step()
    with pytest.raises(UnlabelledMatmul):
        compiled.read_step(step)


def test_a_compiled_scenario_measures_against_its_compiled_reference(fresh_dynamo):
    scenario = build(Scenario, {"name": "compiled-full", "model": "llama-tiny", "attention": "sdpa", "batch_size": 2,
                                "seq_len": 128, "rounds": 1, "activation": {"strategy": "full"},
                                "compile": {"scope": "block"}, "measure": ["memory", "timing"]}, "t.yaml")
    result = run_scenario(scenario, RunContext.resolve("cpu", "auto"))
    assert result.status == "measured", (result.reason, result.notes)
    m = result.metrics
    assert result.probe == "allocator" and m["peak_memory_source"] == compiled.PEAK_SOURCE_CPU
    assert m["compile_time_s"] > 0 and m["reference_compile_time_s"] > 0 and m["recompiles"] == 0
    assert m["compiled_regions"] == 3 and m["reference_peak_bytes"] > m["peak_bytes"] > m["state_bytes"] > 0
    assert 0 < m["memory_saving"] < 1 and m["step_time_s"] > 0 and m["overhead"] > 0
    # the compiled-step simulator beside it (simulate.compiled), within the 5% bound; control: the bound tells the
    # strategy from its reference (a simulation of the wrong step would be outside it)
    sim, ref = m["compiled_simulated_peak_bytes"], m["reference_peak_bytes"]
    assert abs(sim - m["peak_bytes"]) <= 0.05 * m["peak_bytes"] and abs(sim - ref) > 0.05 * ref


# the compiled suite's Hugging Face row (suites/compiled.yaml: compiled-hf-llama-full), at a smaller workload
HF_LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 256}


@pytest.mark.parametrize("strategy", ["none", "full"])
def test_a_compiled_hugging_face_scenario_is_simulated_within_the_bound(fresh_dynamo, strategy):
    """A transformers model compiled per block: the compiled-step simulator builds it from its config as the
    measured row does (``models.hf.card``) and predicts the allocator's peak within the 5% bound; control: the bound
    tells ``full`` from its reference."""
    pytest.importorskip("transformers", reason="Hugging Face models need the optional extra pytest-flashckpt[hf]")
    scenario = build(Scenario, {"name": f"compiled-hf-{strategy}", "model": {"hf": HF_LLAMA}, "attention": "sdpa",
                                "batch_size": 2, "seq_len": 128, "rounds": 1, "activation": {"strategy": strategy},
                                "compile": {"scope": "block"}, "measure": ["memory"]}, "t.yaml")
    result = run_scenario(scenario, RunContext.resolve("cpu", "auto"))
    assert result.status == "measured", (result.reason, result.notes)
    m = result.metrics
    assert m["compiled_regions"] == 2 and m["recompiles"] == 0
    sim = m["compiled_simulated_peak_bytes"]
    assert abs(sim - m["peak_bytes"]) <= 0.05 * m["peak_bytes"], (sim, m["peak_bytes"])
    if strategy == "full":
        ref = m["reference_peak_bytes"]
        assert abs(sim - ref) > 0.05 * ref


def test_a_compiled_budget_plan_holds_its_budget_on_compiled_blocks(fresh_dynamo):
    """``budget`` on compiled blocks runs the compiled plan (one selective-checkpoint policy per block,
    activation.budget.compile_policy): the measured compiled peak is within the plan's budget, which the
    reference's peak is not (control: the budget binds)."""
    scenario = build(Scenario, {"name": "compiled-budget", "model": "llama-tiny", "attention": "sdpa", "batch_size": 2,
                                "seq_len": 128, "rounds": 1, "activation": {"strategy": "budget", "budget": "min + 50%"},
                                "compile": {"scope": "block"}, "measure": ["memory", "timing"]}, "t.yaml")
    result = run_scenario(scenario, RunContext.resolve("cpu", "auto"))
    assert result.status == "measured", (result.reason, result.notes)
    m = result.metrics
    assert m["compiled_regions"] == 3 and m["recompiles"] == 0
    assert m["peak_bytes"] <= m["budget_bytes"] < m["reference_peak_bytes"]
    assert any(n.startswith("activation: compiled budget plan") for n in result.notes)
    # its simulation runs the same plan's policies: within the 5% bound of the measured peak
    assert abs(m["compiled_simulated_peak_bytes"] - m["peak_bytes"]) <= 0.05 * m["peak_bytes"]
    # the plan was checked compiled: the check's simulation is of the plan kept, the same step as the row's
    assert m["budget_compiled_check_peak_bytes"] == m["compiled_simulated_peak_bytes"] <= m["budget_bytes"]
    assert m["budget_replans"] >= 0 and any("compiled check (simulate_compiled_step) holds" in n for n in result.notes)


@pytest.mark.parametrize("strategy", ["full", "every_k"])
def test_the_checkpoint_outside_the_compiled_block_agrees_with_eager_and_recomputes_each_region(fresh_dynamo, strategy):
    """compile.ac_wrapper: outside (each checkpointed block's own forward compiled, the checkpoint eager around it):
    loss and gradients as eager, no graph break, and a checkpointed block's region runs twice a step (the forward and
    the recomputation), a plain one (every_k's block 1) once."""
    counters = fresh_dynamo
    eager, trainer = _trainer(strategy), _trainer(strategy)
    config = build(Scenario, {"name": "s", "activation": {"strategy": strategy},
                              "compile": {"scope": "block", "ac_wrapper": "outside"}}, "t.yaml").compile
    regions = compiled.compile_model(trainer.model, config)
    blocks = len(get_blocks(trainer.model, get_anatomy(trainer.model)))
    assert regions == (2 * blocks if strategy == "full" else 2 * 2 + 1)  # every_k (k 2) of 3 blocks: 0 and 2
    _agrees_with_eager(eager, trainer)
    assert counters["frames"]["ok"] >= 1 and not counters["graph_break"]
    step = compiled.torch_hidden_warning(trainer.train_step)
    step()
    assert compiled.read_step(step).compiled_regions == regions


@pytest.mark.parametrize("strategy", ["full", "every_k"])
def test_a_compiled_scenario_with_the_checkpoint_outside_is_measured_and_simulated_within_the_bound(fresh_dynamo, strategy):
    """The checkpoint around each compiled block (compile.ac_wrapper: outside): measured, and simulated by the
    compiled simulator built the same way (``simulate.compiled.compile_scope``), within the 5% bound; control: the
    bound tells the row from its reference."""
    scenario = build(Scenario, {"name": f"compiled-{strategy}-outside", "model": "llama-tiny", "attention": "sdpa",
                                "batch_size": 2, "seq_len": 128, "rounds": 1, "activation": {"strategy": strategy},
                                "compile": {"scope": "block", "ac_wrapper": "outside"}, "measure": ["memory"]}, "t.yaml")
    result = run_scenario(scenario, RunContext.resolve("cpu", "auto"))
    assert result.status == "measured", (result.reason, result.notes)
    m = result.metrics
    regions = 6 if strategy == "full" else 5  # 3 blocks: a checkpointed one runs its region in the forward and recompute
    assert m["compiled_regions"] == regions and m["recompiles"] == 0
    assert m["reference_peak_bytes"] > m["peak_bytes"] > m["state_bytes"] > 0
    sim, ref = m["compiled_simulated_peak_bytes"], m["reference_peak_bytes"]
    assert abs(sim - m["peak_bytes"]) <= 0.05 * m["peak_bytes"], (sim, m["peak_bytes"])
    assert abs(sim - ref) > 0.05 * ref


def test_offload_around_each_compiled_block_keeps_strides_and_agrees_with_eager(fresh_dynamo, monkeypatch):
    """``offload`` compiled (its hooks around each compiled block, compile.ac_wrapper: outside): the product's
    stride-keeping hooks are the ones installed, they pack every block's saved tensors, and loss and gradients equal
    eager's with no graph break and one region per block. On a CPU the copies stay in host memory, so nothing is
    freed (the strategy runs on a GPU only; reports/spike-compiled-offload.md measured what the hooks let go of);
    this checks the training. Control: torch's ``save_on_cpu(pin_memory=True)`` around the same compiled blocks
    brings a saved view back contiguous and Inductor's backward refuses it, which is why the hooks keep strides."""
    from pytest_flashckpt import compile_step
    from pytest_flashckpt.activation.options import OFFLOAD
    from pytest_flashckpt.activation.wrapper import install_block_forwards, save_on_host_keeping_strides

    counters = fresh_dynamo
    packs = []

    def counted():
        hooks = save_on_host_keeping_strides()
        pack = hooks.pack_hook
        hooks.pack_hook = lambda tensor: packs.append(tensor.numel()) or pack(tensor)
        return hooks

    monkeypatch.setattr(compile_step, "save_on_host_keeping_strides", counted)
    eager = _trainer("none")
    model = build_model(load_card("llama-tiny"), "sdpa", torch.device("cpu"), torch.float32, seed=0)
    anatomy = get_anatomy(model)
    blocks = get_blocks(model, anatomy)
    forwards = install_block_forwards(model, blocks, anatomy, [OFFLOAD] * len(blocks))
    trainer = Trainer.create(model, 2, 32, seed=0)
    config = build(Scenario, {"name": "s", "activation": {"strategy": "offload"},
                              "compile": {"scope": "block", "ac_wrapper": "outside"}}, "t.yaml").compile
    assert compiled.compile_model(trainer.model, config) == len(blocks)  # the region runs once: no recomputation
    assert all(forward.offload_context is counted for forward in forwards)
    _agrees_with_eager(eager, trainer)
    assert len(packs) >= 4 * len(blocks) and not counters["graph_break"]

    for forward in forwards:  # control
        forward.offload_context = lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)
    with pytest.raises(AssertionError, match="stride"):
        _agrees_with_eager(eager, trainer)
