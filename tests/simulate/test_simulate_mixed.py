"""Mixed precision (float32 master state, bf16 compute) and pure bf16 on a CPU: the simulated peak equals the cpu
probe's measured peak of the same real CPU step to the byte; torch's autocast does nothing on meta, so the
simulator's model of it (``simulate.autocast``) is checked op by op against real CPU autocast."""

import dataclasses

import pytest
import torch

from pytest_flashckpt.activation import apply_ac
from pytest_flashckpt.config.cards.gpt import GPTConfig
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.cards import build_model, load_card
from pytest_flashckpt.probes.cpu import LiveTensorProbe
from pytest_flashckpt.simulate import simulate_step
from pytest_flashckpt.simulate import modes as sim_modes
from pytest_flashckpt.simulate.autocast import MetaAutocast, meta_autocast
from pytest_flashckpt.training import Trainer

# an odd-sized card whose activations outweigh its states (so every strategy peaks in the forward or backward):
# 3 blocks, width 90 over 3 heads of 30, a vocabulary of 515 tokens
ODD = GPTConfig(name="odd", vocab_size=515, block_size=512, n_layer=3, n_head=3, n_embd=90)
STRATEGIES = ("none", "full", "every_k", "selective_op")
# (card, batch, seq): tiny peaks in the optimizer step below 2 x 512 with checkpointing
WORKLOADS = {"odd": (ODD, 1, 384), "tiny": ("tiny", 2, 512)}


def measured_cpu_peak(card, strategy: str, batch: int, seq: int, precision: str) -> tuple[int, int]:
    """The runner's measurement of a bf16 step (pure, or mixed: float32 model under CPU autocast)."""
    mixed = precision == "mixed"
    model = build_model(load_card(card) if isinstance(card, str) else card, "sdpa", "cpu",
                        torch.float32 if mixed else torch.bfloat16)
    if strategy != "none":
        apply_ac(model, ActivationConfig(strategy=strategy))
    trainer = Trainer.create(model, batch, seq, autocast=torch.bfloat16 if mixed else None)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    return reading.peak_bytes, reading.start_bytes


def _cases(fast: set):
    return [pytest.param(w, s, marks=() if (w, s) in fast else pytest.mark.slow, id=f"{w}-{s}")
            for w in WORKLOADS for s in STRATEGIES]


def _check(workload: str, strategy: str, precision: str) -> None:
    card, batch, seq = WORKLOADS[workload]
    peak, start = measured_cpu_peak(card, strategy, batch, seq, precision)
    sim = simulate_step(card, "bf16", batch, seq, "sdpa", strategy, target="cpu", precision=precision)
    assert (sim.peak_bytes, sim.start_bytes) == (peak, start)
    assert sim.peak_phase in ("forward", "backward")  # activations (and mixed's weight casts) are at the peak
    assert sum(sim.breakdown.values()) == sim.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "strategy"), _cases({("odd", "none"), ("odd", "full")}))
def test_mixed_simulated_equals_measured(workload, strategy):
    """float32 master weights and AdamW state, the forward under CPU autocast (bf16), vs the meta autocast model."""
    _check(workload, strategy, "mixed")


@pytest.mark.parametrize(("workload", "strategy"), _cases({("odd", "selective_op")}))
def test_pure_bf16_simulated_equals_measured(workload, strategy):
    """The CPU's LayerNorm keeps its mean and rstd in bf16 (meta's in float32): modelled for target cpu."""
    _check(workload, strategy, "pure")


# mixed precision + dropout + selective_op: the simulation reads one CPU RNG state (5,056 B) short of the real step
# since the probe counts checkpointing's RNG states (issue 21); the other cases are exact. Strict: a fix shows here.
_RNG_GAP = pytest.mark.xfail(strict=True, reason="one CPU RNG state (5,056 B) short under autocast + dropout + selective_op")


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "dropout", "strategy"), [("eager", 0.0, "none"), ("eager", 0.0, "full"),
                                                          pytest.param("sdpa", 0.1, "selective_op", marks=_RNG_GAP),
                                                          ("eager", 0.1, "full")])
def test_mixed_eager_and_dropout_simulated_equals_measured(kernel, dropout, strategy):
    """Eager attention (T x T scores) and dropout (CPU SDPA's math path) under autocast: exact too."""
    card = dataclasses.replace(ODD, dropout=dropout)
    model = build_model(card, kernel, "cpu", torch.float32)
    if strategy != "none":
        apply_ac(model, ActivationConfig(strategy=strategy))
    trainer = Trainer.create(model, 1, 256, autocast=torch.bfloat16)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    sim = simulate_step(card, "bf16", 1, 256, kernel, strategy, target="cpu", precision="mixed")
    assert sim.peak_bytes == reading.peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["full", "selective_op"])
@pytest.mark.xfail(strict=True, reason="pure bf16 with dropout on a CPU: a few KB short (measured 3,224 B full, 5,056 B "
                   "selective_op on the odd card); fp32 with dropout and bf16 without dropout are exact")
def test_pure_bf16_with_dropout_is_a_stated_gap(strategy):
    card = dataclasses.replace(ODD, dropout=0.1)
    model = build_model(card, "sdpa", "cpu", torch.bfloat16)
    apply_ac(model, ActivationConfig(strategy=strategy))
    trainer = Trainer.create(model, 1, 256)
    trainer.train_step()
    with LiveTensorProbe().track(trainer.state_tensors()) as reading:
        trainer.train_step()
    sim = simulate_step(card, "bf16", 1, 256, "sdpa", strategy, target="cpu", precision="pure")
    assert sim.peak_bytes == reading.peak_bytes


def test_bf16_cpu_layer_norm_difference_without_the_cpu_dtypes(monkeypatch):
    """Without the CPU kernels' dtypes the simulation over-counts the LayerNorm statistics alive at the peak (issue
    21 measured +3.8 to +26.9 KB); with them it is exact (above). The difference is a whole number of LayerNorms'
    mean + rstd at (4 - 2) bytes each per token."""
    card, batch, seq = WORKLOADS["odd"]
    peak, _ = measured_cpu_peak(card, "none", batch, seq, "pure")
    monkeypatch.setattr(sim_modes, "CpuKernelDtypes", _NoChange)
    sim = simulate_step(card, "bf16", batch, seq, "sdpa", "none", target="cpu")
    extra, per_layer_norm = sim.peak_bytes - peak, batch * seq * 2 * 2
    assert extra > 0 and extra % per_layer_norm == 0 and extra // per_layer_norm <= 2 * ODD.n_layer + 1


class _NoChange(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_torch_autocast_leaves_meta_tensors_alone():
    """Why the model exists: no Autocast dispatch key on a meta tensor (torch 2.13), so nothing is cast."""
    w = torch.randn(8, 8, device="meta", requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.nn.functional.linear(torch.randn(2, 8, device="meta"), w)
    assert out.dtype == torch.float32
    assert "AutocastCPU" not in str(torch._C._dispatch_keys(w))


def _targets(logits):
    return torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)


def _ops():
    x, w, b = torch.randn(4, 8), torch.randn(6, 8, requires_grad=True), torch.randn(6, requires_grad=True)
    lp = torch.randn(4, 8, dtype=torch.bfloat16)
    q = torch.randn(1, 2, 4, 8)
    return {
        "linear": (torch.nn.functional.linear, (x, w, b)),
        "matmul": (torch.matmul, (x, w.t())),
        "operator @": (lambda a, c: a @ c, (x, w.t())),
        "bmm": (torch.bmm, (x[None], w.t()[None])),
        "addmm": (torch.addmm, (b, x, w.t())),
        "sdpa": (torch.nn.functional.scaled_dot_product_attention, (q, q, q)),
        "cross_entropy": (lambda a: torch.nn.functional.cross_entropy(a, _targets(a)), (lp,)),
        "nll_loss": (lambda a: torch.nn.functional.nll_loss(a, _targets(a)), (lp,)),
        "cat (promote)": (lambda a, c: torch.cat([a, c]), (x, lp)),
        "layer_norm (none on CPU)": (lambda a: torch.nn.functional.layer_norm(a, (8,)), (lp,)),
        "softmax (none on CPU)": (lambda a: torch.softmax(a, -1), (lp,)),
        "gelu": (torch.nn.functional.gelu, (x,)),
    }


@pytest.mark.parametrize("name", list(_ops()))
def test_cpu_policy_matches_real_cpu_autocast(name):
    fn, args = _ops()[name]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        real = fn(*args)
    meta_args = [a.detach().to("meta").requires_grad_(a.requires_grad) for a in args]
    with MetaAutocast("cpu"), torch.autocast("cpu", dtype=torch.bfloat16):
        simulated = fn(*meta_args)
    assert (simulated.dtype, simulated.shape) == (real.dtype, real.shape)


def test_weight_casts_are_cached_until_autocast_exits():
    """torch casts a float32 leaf (a master weight) once per autocast region and drops the cast when the
    outermost autocast exits; the model does the same."""
    w = torch.randn(8, 8, device="meta", requires_grad=True)
    x = torch.randn(2, 8, device="meta")
    scope = meta_autocast("cpu")
    with scope:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            assert len(scope.mode.cache) == 1
        assert scope.mode.cache == {}
    assert scope.mode.casts == 1 + 3  # the weight once, the (non-leaf-free) input each time


def test_an_op_with_an_unmodelled_autocast_policy_raises():
    """torch registers a CPU autocast kernel for trace (fp32); the model names no policy for it: it says so
    instead of running it uncast."""
    with MetaAutocast("cpu"), torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(NotImplementedError, match="aten::trace"):
            torch.trace(torch.randn(3, 3, device="meta"))


def test_gpt3_2_7b_mixed_state_is_the_back_of_envelope():
    """Mixed precision on gpt3-2.7b (N parameters, tied head counted once), predicted for a GPU:

    - resident between steps: float32 master weights 4N + AdamW exp_avg and exp_avg_sq 8N = 12N
      (pure bf16: 2N + 4N = 6N, half of it);
    - in the optimizer step: + float32 gradients 4N = 16 bytes per parameter;
    - in the forward: + the bf16 weight casts autocast caches, 2N, alive until the forward's autocast exits.
    """
    # 4 of its 32 blocks, at its full width, heads and (tied) vocabulary: every count below is bytes per parameter,
    # the same for each block whatever the depth; the 28 blocks left out only repeated the same ops on meta (most of
    # this file's CPU time, the mixed step's per-tensor AdamW over fp32 masters above all)
    card = load_card("gpt3-2.7b", n_layer=4)
    n = card.num_params()
    mixed = simulate_step(card, "bf16", 1, 128, "flash", "none", precision="mixed")
    pure = simulate_step(card, "bf16", 1, 128, "flash", "none")
    assert mixed.start_bytes == 12 * n and pure.start_bytes == 6 * n
    assert mixed.breakdown["parameters"] == 4 * n and mixed.breakdown["optimizer_state"] == 8 * n
    assert mixed.peak_phase == "optimizer" and mixed.breakdown["gradients"] == 4 * n
    assert mixed.peak_bytes >= 16 * n
    print(f"gpt3-2.7b, 4 blocks (N = {n:,}): mixed start {mixed.start_bytes / 2**30:.2f} GiB = 12N, peak "
          f"{mixed.peak_bytes / 2**30:.2f} GiB ({mixed.peak_bytes / n:.2f} B/param); pure bf16 start "
          f"{pure.start_bytes / 2**30:.2f} GiB, peak {pure.peak_bytes / 2**30:.2f} GiB")


def test_mixed_needs_bf16_and_one_process():
    with pytest.raises(ValueError, match="precision mixed computes in bfloat16"):
        simulate_step("tiny", "fp32", 1, 64, "sdpa", target="cpu", precision="mixed")
    with pytest.raises(ValueError, match="FSDP2's MixedPrecisionPolicy"):
        simulate_step("tiny", "bf16", 2, 64, "sdpa", target="cpu", precision="mixed", world_size=2)
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        simulate_step("tiny", "bf16", 1, 64, "sdpa", target="cpu", precision="half")
