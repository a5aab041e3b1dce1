"""``simulate_step``: the real training step (forward, backward, AdamW step) on the ``meta`` device, measured by
the cpu probe's live-storage accounting; nothing is allocated, so any model card fits on any machine.

The step is the one ``Trainer.train_step`` runs (the same model code, activation strategy and optimizer); only
the device and the attention op differ (see ``kernels``). A first step creates AdamW's state, the second is
measured, as the runner measures real runs. See README "Will it fit?" for what equals a real run to the byte.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace

import torch

from pytest_flashckpt.activation import apply_ac, apply_budget
from pytest_flashckpt.config.model_card import ModelCard
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.config.step_impl import StepImpl, card_with_norm, check_simulated
from pytest_flashckpt.models.anatomy import get_blocks
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.simulate.costs import SimulatedCosts
from pytest_flashckpt.simulate.modes import PRECISIONS, step_modes
from pytest_flashckpt.simulate.probe import AttributedStorages
from pytest_flashckpt.simulate.result import SimulatedPeak
from pytest_flashckpt.simulate.step_impl import impl_modes, stand_in_cuda_fused_norms
from pytest_flashckpt.simulate.workload import check_workload, dtype_name, simulated_model, simulated_trainer
from pytest_flashckpt.training import Trainer

def simulate_step(
    card: ModelCard | str,
    dtype: str | torch.dtype = "bfloat16",
    batch_size: int = 8,
    seq_len: int = 2048,
    kernel: str = "flash",
    strategy: str = "none",
    k: int = 2,
    target: str = "cuda",
    world_size: int = 1,
    save_ops: tuple[str, ...] | None = None,
    seed: int = 0,
    budget: str | int | float | None = None,
    precision: str = "pure",
    impl: StepImpl | None = None,
) -> SimulatedPeak:
    """The exact peak of one training step of ``card`` on ``target`` (per rank when ``world_size`` > 1: the
    rank's batch is ``batch_size / world_size`` and parameters, gradients and optimizer state are FSDP shards,
    see ``simulate.fsdp``). Strategy ``budget`` plans ``budget`` from simulated costs (``simulate.costs``) and
    simulates the planned step; the plan is in ``SimulatedPeak.plan``. ``precision`` ``mixed``: float32
    parameters (master weights), gradients and AdamW state, the forward autocast to ``dtype`` (``simulate.autocast``
    models torch's autocast on meta); ``pure``: everything in ``dtype``. ``impl``: the norm, optimizer and loss
    (``config.step_impl``; None: the default step); the optimizer phase is that optimizer's own step on meta
    (``simulate.step_impl`` for what meta needs to run the target's fused kernels)."""
    started = time.perf_counter()
    impl = impl or StepImpl()
    config = card_with_norm(load_card(card) if isinstance(card, str) else card, impl.norm)
    name = dtype_name(dtype)
    check_workload(config, batch_size, seq_len, world_size)
    check_precision(precision, name, world_size, strategy)
    check_simulated(impl, strategy, world_size, getattr(config, "norm", "plain"), precision, target)
    model = simulated_model(config, name, kernel, target, seed, precision)
    if target == "cuda":
        stand_in_cuda_fused_norms(model)  # nn.RMSNorm (a fused norm) is one _fused_rms_norm kernel on CUDA
    backend = model.backend
    plan: dict = {}
    if strategy == "budget":
        plan = _apply_budget(model, config, name, kernel, target, world_size, budget, (batch_size // world_size, seq_len), seed)
    elif strategy != "none":
        apply_ac(model, ActivationConfig(strategy=strategy, k=k, save_ops=save_ops))
    trainer = simulated_trainer(model, batch_size // world_size, seq_len, target, seed, autocast_dtype(precision, name), impl)
    modes = step_modes(target, precision)
    modes.modes += impl_modes(impl)
    with modes.outside_probe():
        trainer.train_step()  # the optimizer's state exists after it, as after the runner's warm-up
    sharding: dict[str, int] = {}
    ratio = 1.0
    if world_size > 1:
        from pytest_flashckpt.simulate.fsdp import all_gathered_bytes, sharded_param_bytes

        full, per_rank = sharded_param_bytes(model, world_size)
        ratio = per_rank / full
        sharding = {"world_size": world_size, "parameter_bytes_full": full, "parameter_bytes_per_rank": per_rank,
                    "all_gathered_bytes": all_gathered_bytes(model)}
    with modes.outside_probe():
        probe, host_bytes = _measured_step(trainer, count_host=target == "cpu", shard_ratio=ratio,
                                           gathered=sharding.get("all_gathered_bytes", 0))
    peak = _result(config, name, batch_size, seq_len, backend, strategy, target, probe, host_bytes, world_size, sharding)
    return replace(peak, seconds=time.perf_counter() - started, plan=plan, precision=precision)


def check_precision(precision: str, dtype: str, world_size: int = 1, strategy: str = "none") -> None:
    """ValueErrors naming the value for a precision the simulator cannot model."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")
    if precision == "mixed" and dtype != "bfloat16":
        raise ValueError(f"precision mixed computes in bfloat16 over float32 master weights; dtype {dtype} has no "
                         "mixed form here: use dtype bf16 (or precision pure)")
    if precision == "mixed" and strategy == "budget":
        raise ValueError("precision mixed with the budget strategy is not simulated (the planner's costs are simulated "
                         "without autocast); use a fixed strategy or precision pure")
    if precision == "mixed" and world_size > 1:
        raise ValueError("precision mixed is simulated for one process (autocast); FSDP2's MixedPrecisionPolicy "
                         "per rank is not simulated: use world size 1, or precision pure")


def autocast_dtype(precision: str, dtype: str) -> torch.dtype | None:
    """The trainer's autocast dtype: the compute dtype in mixed precision, None in pure precision."""
    return getattr(torch, dtype) if precision == "mixed" else None


def _apply_budget(model, config, dtype, kernel, target, world_size, budget, shape, seed) -> dict:
    """Plan ``budget`` for ``shape`` from simulated costs and put ``model``'s blocks under the plan."""
    if budget is None:
        raise ValueError("strategy 'budget' needs a budget (a size such as '60 GiB', a fraction, or 'min + 30%')")
    source = SimulatedCosts.shared(config, dtype, kernel, target, world_size, seed=seed)
    started = time.perf_counter()
    applied = apply_budget(model, budget, shape, source=source)
    shape_plan = applied.plans[shape]
    return {**shape_plan.to_dict(), "plan_s": time.perf_counter() - started, "describe": shape_plan.describe(),
            "excluded": dict(shape_plan.costs.excluded), "notes": list(shape_plan.costs.notes)}


def _measured_step(trainer: Trainer, count_host: bool, shard_ratio: float = 1.0, gathered: int = 0) -> tuple[AttributedStorages, int]:
    model, optimizer = trainer.model, trainer.optimizer
    probe = AttributedStorages("meta", shard_ratio)
    probe.count_rng_states = count_host  # checkpointing's CPU RNG states are device memory only on a CPU
    for p in model.parameters():
        probe.add_resident(p, "parameters")
    for b in model.buffers():  # resident as in a measured step (Trainer.state_tensors): a Hugging Face rotary table
        probe.add_resident(b, "parameters")
    host_bytes = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                probe.add_resident(value, "optimizer_state")
                if count_host and value.device.type == "cpu":
                    host_bytes += value.untyped_storage().nbytes()
    probe.start_bytes = probe.live_bytes
    probe.rank_start = probe.rank_live
    kept: dict[str, dict[int, int]] = {}

    def forward_done(_module, _args, _output) -> None:
        kept["snapshot"] = probe.snapshot()
        probe.phase = "backward"

    def block_hooks(index: int):
        def enter(_module, _args) -> None:
            probe.block = index

        def leave(_module, _args, _output) -> None:
            probe.block = None

        return enter, leave

    with ExitStack() as stack:
        handles = [model.register_forward_hook(forward_done)]
        for i, block in enumerate(get_blocks(model)):
            enter, leave = block_hooks(i)
            handles += [block.register_forward_pre_hook(enter), block.register_forward_hook(leave)]
        for p in model.parameters():
            handles.append(p.register_post_accumulate_grad_hook(lambda param: probe.tag(param.grad, "gradients")))
        handles.append(optimizer.register_step_pre_hook(lambda *_: setattr(probe, "phase", "optimizer")))
        if gathered:
            from pytest_flashckpt.simulate.fsdp import hold_gathered

            handles.append(hold_gathered(probe, optimizer, gathered))
        for handle in handles:
            stack.callback(handle.remove)
        with probe:
            trainer.train_step()
    probe.kept_snapshot = kept.get("snapshot", {})
    return probe, host_bytes


def _result(config, name, batch_size, seq_len, backend, strategy, target, probe, host_bytes, world_size, sharding) -> SimulatedPeak:
    blocks, outside = probe.by_block(probe.kept_snapshot, config.num_blocks)
    if sharding:  # a rank's view, plus the all-gathered parameters (modelled) outside the optimizer step
        from pytest_flashckpt.simulate.fsdp import gathered_in

        breakdown = probe.breakdown(probe.rank_peak_snapshot)
        breakdown["temporaries"] += gathered_in(probe.rank_peak_phase, sharding["all_gathered_bytes"])
        peak_bytes, start_bytes, end_bytes = sum(breakdown.values()), round(probe.rank_start), round(probe.rank_live)
        op, phase = probe.rank_peak_op, probe.rank_peak_phase
    else:
        breakdown = probe.breakdown(probe.peak_snapshot)
        peak_bytes, start_bytes, end_bytes = probe.peak_bytes, probe.start_bytes, probe.live_bytes
        op, phase = probe.peak_op, probe.peak_phase
    breakdown["optimizer_state"] += host_bytes
    return SimulatedPeak(
        card=config.name, dtype=name, batch_size=batch_size, seq_len=seq_len, kernel=backend, strategy=strategy,
        target=target, peak_bytes=peak_bytes + host_bytes, start_bytes=start_bytes + host_bytes,
        end_bytes=end_bytes + host_bytes,
        breakdown=breakdown, peak_op="" if op is None else str(op), peak_phase=phase, block_kept_bytes=blocks,
        outside_kept_bytes=outside, host_bytes=host_bytes, world_size=world_size, sharding=sharding,
    )
