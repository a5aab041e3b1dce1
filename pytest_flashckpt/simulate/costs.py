"""``SimulatedCosts``: the budget planner's per-block costs (``activation.budget.model.PlanCosts``) for a card no
CPU holds, read off training steps simulated on the ``meta`` device.

The steps are the ones ``MeasuredCosts`` measures on a CPU (one warm step, then one step per block option with
every block under that option) and the numbers come from the same segment probe and the same derivation
(``activation.budget.costs.segment_costs``); only the device (``meta``: nothing is allocated) and the attention
op differ (``simulate.kernels``: the op the predicted device runs). A ``cpu`` prediction therefore equals
``MeasuredCosts`` to the byte (``tests/simulate/test_simulated_costs.py``), AdamW's host step counters included
(CPU tensors the ``meta`` probe cannot see, added as resident bytes, as ``simulate_step`` does).

What is modelled rather than run:

- ``offload`` (``cuda`` targets only): ``save_on_cpu`` cannot copy data off ``meta``. ``SimulatedOffload`` does to
  device memory what ``save_on_cpu`` does: packing drops the device tensor (its bytes live on the host), unpacking
  allocates a contiguous device tensor of the same size, once per saved tensor, when its backward node runs. The
  bytes packed are counted (``PlanCosts.transfer``: out and back); their time is priced by ``transfer_weight``
  (FLOP-equivalents per byte, ``measure_transfer_weight`` on a GPU). Without a weight an offload would look free
  to the FLOP objective and win every block, so offload is then left out, with that reason in
  ``PlanCosts.excluded``; asking for it explicitly without a weight is a ValueError.
- the pointwise weight (FLOP-equivalents of one recomputed pointwise element) is the fixed model's for the target
  (``activation.budget.costs.pointwise_weight_for``), as ``MeasuredCosts`` uses: no timing, so a simulated and a
  measured plan of the same budget are the same plan (``PlanCosts.notes`` says which weight).
- FSDP (``world_size`` > 1) is refused: the segment probe has no per-rank view yet (``simulate.probe`` has one for
  whole-step peaks), so a per-rank plan would be wrong, not approximate.
"""

from __future__ import annotations

import time
from functools import partial

import torch

from pytest_flashckpt.activation.budget.costs import (
    MACHINE_BALANCE,
    install_marks,
    measure_transfer_weight,
    pointwise_weight_for,
    quiet,
    segment_costs,
)
from pytest_flashckpt.activation.budget.model import PlanCosts
from pytest_flashckpt.activation.options import OFFLOAD, BlockOption, default_options
from pytest_flashckpt.activation.wrapper import switchable_forwards
from pytest_flashckpt.models.cards import load_card
from pytest_flashckpt.config.model_card import ModelCard
from pytest_flashckpt.simulate.kernels import TARGETS
from pytest_flashckpt.simulate.workload import check_workload, dtype_name, simulated_model, simulated_trainer


class SimulatedOffload(torch.autograd.graph.saved_tensors_hooks):
    """``save_on_cpu(pin_memory=True)`` as device memory sees it, on ``meta`` (see the module docstring); adds the
    bytes each packed tensor would copy to ``counter[index]``."""

    def __init__(self, counter: list[int], index: int) -> None:
        def pack(tensor: torch.Tensor):
            counter[index] += tensor.numel() * tensor.element_size()
            return tensor.device, tensor.size(), tensor.dtype, tensor.layout

        def unpack(packed) -> torch.Tensor:
            device, size, dtype, layout = packed
            return torch.empty(size, dtype=dtype, layout=layout, device=device)

        super().__init__(pack, unpack)


class SimulatedCosts:
    """``CostSource`` for ``card`` in ``dtype`` with attention ``kernel`` on ``target`` (``cuda`` or ``cpu``),
    simulated on ``meta``. ``options`` defaults to every option the planner knows on ``target`` (offload on
    ``cuda`` only); an option that cannot be simulated is a ValueError naming it. Costs are cached per shape."""

    def __init__(
        self,
        card: ModelCard | str,
        dtype: str | torch.dtype = "bfloat16",
        kernel: str = "flash",
        target: str = "cuda",
        world_size: int = 1,
        options: tuple[BlockOption, ...] | None = None,
        pointwise_weight: float | None = None,
        transfer_weight: float | None = None,
        seed: int = 0,
    ) -> None:
        _refuse_unsimulated(target, world_size)
        self.config = load_card(card) if isinstance(card, str) else card
        self.dtype = dtype_name(dtype)
        self.kernel, self.target, self.world_size, self.seed = kernel, target, world_size, seed
        self.options, self.excluded = _planned_options(options, target, transfer_weight)
        self.transfer_weight = transfer_weight or 0.0
        self.notes: tuple[str, ...] = ()
        with quiet():
            self.model = simulated_model(self.config, self.dtype, kernel, target, seed)
            self.forwards = switchable_forwards(self.model)
            self._packed = [0] * len(self.forwards)  # bytes each block's offload packs (SimulatedOffload)
            for i, forward in enumerate(self.forwards):
                forward.offload_context = partial(SimulatedOffload, self._packed, i)
            if pointwise_weight is None:
                pointwise_weight, self.notes = _fixed_pointwise_weight(target, self.dtype)
        self.pointwise_weight = pointwise_weight
        self._probe_ref: list = []
        install_marks(self.model, self._probe_ref)
        self._trainer = None
        self._cache: dict[tuple[int, int], PlanCosts] = {}

    _shared: dict = {}

    @classmethod
    def shared(cls, card: ModelCard | str, dtype="bfloat16", kernel="flash", target="cuda", world_size=1, seed=0,
               pointwise_weight: float | None = None, transfer_weight: float | None = None) -> "SimulatedCosts":
        """One source per (card, dtype, kernel, target, weights) in this process: scenarios planning the same card
        share its simulated costs (per shape) instead of simulating again."""
        config = load_card(card) if isinstance(card, str) else card
        key = (config, dtype_name(dtype), kernel, target, world_size, seed, pointwise_weight, transfer_weight)
        if key not in cls._shared:
            cls._shared[key] = cls(config, dtype, kernel, target, world_size, seed=seed,
                                   pointwise_weight=pointwise_weight, transfer_weight=transfer_weight)
        return cls._shared[key]

    def costs(self, batch_size: int, seq_len: int) -> PlanCosts:
        if (batch_size, seq_len) not in self._cache:
            check_workload(self.config, batch_size, seq_len, self.world_size)
            self._cache[batch_size, seq_len] = self._simulate(batch_size, seq_len)
        return self._cache[batch_size, seq_len]

    def _simulate(self, batch_size: int, seq_len: int) -> PlanCosts:
        started = time.perf_counter()
        self._packed[:] = [0] * len(self._packed)  # only the offload step packs: its bytes per block
        with quiet():
            if self._trainer is None:
                self._trainer = simulated_trainer(self.model, batch_size, seq_len, self.target, self.seed)
                self._trainer.train_step()  # AdamW's state exists from here on; on meta no shape needs warming
            costs = segment_costs(
                self._trainer, self.forwards, self.options, self._probe_ref, batch_size, seq_len,
                device_type="meta", resident_bytes=self._host_bytes(), pointwise_weight=self.pointwise_weight,
                rng_states=self.target == "cpu",
                source="simulated", warm_step=False, optimizer_once=True,
            )
        if OFFLOAD in self.options:
            o = self.options.index(OFFLOAD)
            costs.transfer = [[2 * self._packed[i] if j == o else 0 for j in range(len(self.options))] for i in range(len(self._packed))]
            costs.transfer_weight = self.transfer_weight
        costs.excluded = dict(self.excluded)
        costs.notes = self.notes
        costs.seconds = time.perf_counter() - started
        return costs

    def _host_bytes(self) -> int:
        """A ``cpu`` prediction counts AdamW's step counters: CPU tensors even for ``meta`` parameters, so the
        ``meta`` probe never sees them (``simulate_step`` counts them the same way); a ``cuda`` one does not (host
        memory there). They exist after the trainer's first step."""
        if self.target != "cpu":
            return 0
        optimizer = self._trainer.optimizer
        return sum(
            value.untyped_storage().nbytes()
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and value.device.type == "cpu"
        )


def _refuse_unsimulated(target: str, world_size: int) -> None:
    """A target without a simulated kernel, or FSDP ranks (no per-rank segment probe yet): a ValueError saying so."""
    if target not in TARGETS:
        raise ValueError(f"SimulatedCosts: unknown target {target!r}; valid: {', '.join(TARGETS)}")
    if world_size != 1:
        raise ValueError(
            f"SimulatedCosts: world_size {world_size} is not simulated for budget plans (the segment probe has no "
            "per-rank FSDP view yet); plan with world_size 1, or simulate fixed strategies per rank with simulate_step"
        )


def _planned_options(
    options: tuple[BlockOption, ...] | None, target: str, transfer_weight: float | None,
) -> tuple[tuple[BlockOption, ...], dict[str, str]]:
    """The options to plan with and the ones left out with the reason. By default every option the planner knows on
    ``target``, offload left out where nothing prices it (see the module docstring); an offload asked for where it
    cannot be simulated or priced is a ValueError."""
    excluded: dict[str, str] = {}
    if options is None:
        options = default_options(target)
        if target != "cuda":
            excluded[OFFLOAD.name] = f"target {target}: there is no device memory to offload from"
        elif transfer_weight is None:
            options = tuple(o for o in options if o != OFFLOAD)
            excluded[OFFLOAD.name] = (
                "no transfer_weight (no GPU to time host copies on): its cost is not FLOPs, so unpriced it would "
                "look free; pass transfer_weight (measure_transfer_weight on the GPU) to plan with it"
            )
    elif OFFLOAD in options and target != "cuda":
        raise ValueError(
            f"SimulatedCosts: option 'offload' moves saved tensors from GPU to host memory; on target {target!r} "
            "there is no device memory to free (drop it from options, or use target 'cuda')"
        )
    elif OFFLOAD in options and transfer_weight is None:
        raise ValueError(
            "SimulatedCosts: option 'offload' needs transfer_weight (FLOP-equivalents per byte moved to the host, "
            "measure_transfer_weight on the GPU): unpriced, an offload would look free and win every block"
        )
    return tuple(options), excluded


def _fixed_pointwise_weight(target: str, dtype: str) -> tuple[float, tuple[str, ...]]:
    """The fixed model's pointwise weight for ``target`` (``pointwise_weight_for``, as ``MeasuredCosts`` uses) and
    the note the plan carries about it."""
    weight = pointwise_weight_for(target, getattr(torch, dtype))
    note = (f"pointwise recomputation priced at {weight:.0f} FLOP-equivalents per element (fixed model for {target}: "
            f"2 x itemsize x {MACHINE_BALANCE[target]:.0f} FLOP/B, not timed)")
    return weight, (note,)


_KERNEL_OF_BACKEND = {"flash_attn": "flash_attn", "sdpa": "sdpa", "eager": "eager"}


def cpu_costs_for(model: torch.nn.Module) -> SimulatedCosts | None:
    """The cost source of a ``budget`` run on a CPU: costs simulated for a ``cpu`` target, which equal the ones
    measured with the exact probe to the byte (``tests/simulate/test_simulated_costs.py``) at a fraction of the time
    (``reports/budget-plan-speed.md``). None (plan from measured costs) where that equality is not tested: dropout
    (SDPA then takes another path) or an attention backend other than ``sdpa``."""
    backend = getattr(model, "backend", None)
    if backend != "sdpa" or getattr(model.config, "dropout", 0.0):
        return None
    param = next(model.parameters())
    return SimulatedCosts.shared(model.config, param.dtype, backend, "cpu")


def cuda_costs_for(model: torch.nn.Module) -> SimulatedCosts:
    """The cost source of a ``budget`` run on a GPU: the exact probe needs a CPU, so the model's costs are simulated
    (same card, dtype and attention kernel, target ``cuda``), the pointwise weight the fixed model's
    (``pointwise_weight_for``) and the transfer weight timed on the model's GPU (``measure_transfer_weight``), so
    offload is planned too (a plan with offload therefore depends on that timing; without offload it does not). The plan's
    peak is then a prediction of the allocator's live bytes (no CUDA context, workspaces or fragmentation). The
    transfer weight is timed once per device and dtype in a process, so the scenarios of a run that plan the same card
    share one source (``SimulatedCosts.shared`` keys on the weight) and one timing."""
    param = next(model.parameters())
    backend = getattr(model, "backend", "sdpa")
    if backend not in _KERNEL_OF_BACKEND:
        raise ValueError(f"budget on a GPU: no simulated kernel for attention backend {backend!r}")
    key = (str(param.device), param.dtype)
    if key not in _TRANSFER_WEIGHTS:  # timed once per device and dtype: a new timing would be a new shared source
        with quiet():
            _TRANSFER_WEIGHTS[key] = measure_transfer_weight(param.device, param.dtype)
    return SimulatedCosts.shared(model.config, param.dtype, _KERNEL_OF_BACKEND[backend], "cuda",
                                 transfer_weight=_TRANSFER_WEIGHTS[key])


_TRANSFER_WEIGHTS: dict[tuple[str, torch.dtype], float] = {}  # (device, dtype) -> cuda_costs_for's timed weight
