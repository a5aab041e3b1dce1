"""What each block option costs, measured on the real training step: the planner's only input (``PlanCosts``,
``model``: what the numbers mean and why a plan's peak is additive in them).

Sources: ``MeasuredCosts`` runs one real step per option (every block under that option) under the exact
``cpu`` probe with segment marks, on a private copy of the model (built from its config), so planning never
touches the trained model's weights, RNG or measured memory. ``simulate.costs.SimulatedCosts`` runs the same
steps on the ``meta`` device (cards too large for a CPU, CUDA kernels); both derive their ``PlanCosts`` with
``segment_costs`` below, so a simulated plan is read off a step exactly as a measured one is.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import flop_registry, shape_wrapper

from pytest_flashckpt.activation.budget.model import PlanCosts
from pytest_flashckpt.activation.flops import CPU_FLASH_FORMULAS
from pytest_flashckpt.activation.options import NONE, BlockOption, default_options
from pytest_flashckpt.activation.step import StepTrainer, TrainingStep, training_step
from pytest_flashckpt.activation.wrapper import on_output_gradient, switchable_forwards
from pytest_flashckpt.models.anatomy import get_blocks
from pytest_flashckpt.models.cards import build_model
from pytest_flashckpt.probes.cpu import _LiveStorages
from pytest_flashckpt.training import Trainer


_FLOP_FORMULAS = {**flop_registry, **{op: shape_wrapper(f) for op, f in CPU_FLASH_FORMULAS.items()}}


class Mark(NamedTuple):
    """What the probe had counted when the step passed a labelled point (``f3``: block 3's forward begins)."""

    live: int  # bytes live at the mark
    peak: int  # the highest live bytes since the previous mark
    flops: int  # matmul FLOPs so far
    pointwise: int  # pointwise output elements so far


class _Segments(_LiveStorages):
    """The exact live-storage probe plus marks: each mark records live bytes, the peak since the previous mark,
    and the matmul FLOPs and pointwise elements so far. FLOPs use PyTorch's formulas (``flop_registry``, plus
    the CPU flash kernel's from ``activation.flops``) directly: ``FlopCounterMode``'s module tracker keeps
    recomputed tensors of checkpointed blocks alive until the end of the backward pass, which would falsify the
    very memory measured here."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__(device_type)
        self.flops = 0
        self.segment_peak = 0
        self.pointwise_elements = 0
        self.marks: dict[str, Mark] = {}

    def _count(self, tensor: torch.Tensor) -> None:  # every counted storage, checkpointing's RNG states included
        super()._count(tensor)
        self.segment_peak = max(self.segment_peak, self.live_bytes)

    def mark(self, label: str) -> None:
        self.marks[label] = Mark(self.live_bytes, self.segment_peak, self.flops, self.pointwise_elements)
        self.segment_peak = self.live_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        formula = _FLOP_FORMULAS.get(func.overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **(kwargs or {}), out_val=out)
        if torch.Tag.pointwise in func.tags:
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor):
                self.pointwise_elements += first.numel()
        return out


def install_marks(model: nn.Module, probe_ref: list, blocks=None) -> list:
    """Forward pre-/post-hooks on every block and a gradient hook on each block's output; returns handles."""
    handles = []
    for i, block in enumerate(blocks if blocks is not None else get_blocks(model)):

        def pre(_module, _args, i=i) -> None:
            if probe_ref:
                probe_ref[0].mark(f"f{i}")

        def post(_module, _args, output, i=i) -> None:
            if probe_ref:
                probe_ref[0].mark(f"e{i}")
                on_output_gradient(output, lambda i=i: probe_ref[0].mark(f"b{i}") if probe_ref else None)

        handles.append(block.register_forward_pre_hook(pre))
        handles.append(block.register_forward_hook(post))
    return handles


@dataclass
class _Uniform:
    """One measured step with every block under one option."""

    peak: int
    before: int
    kept: list[int]
    reach: list[int]
    flops: list[int]
    pointwise: list[int]


@dataclass(frozen=True)
class _OptimizerSegment:
    """The optimizer step of a measured step: live bytes when it starts, the highest live bytes from there to the
    step's end, and its FLOPs and pointwise elements. Nothing a plan keeps is alive by then (every block's saved
    tensors were freed by the backward pass), so it is the same for every plan: ``optimizer_once`` measures it once."""

    live: int
    peak: int
    flops: int
    pointwise: int


def _forward_backward(trainer: Trainer, mark) -> None:
    """``Trainer.train_step`` up to its optimizer step (``mark("opt")`` where that step would start, the batch and
    loss alive as there), then the gradients dropped as its ``zero_grad`` drops them."""
    trainer.model.train()
    x, y = trainer.batch()
    loss = trainer.loss(x, y)
    loss.backward()
    mark("opt")
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.step += 1


def _segment_step(
    trainer: Trainer, n_blocks: int, probe_ref: list, device_type: str = "cpu", optimizer: _OptimizerSegment | None = None,
    rng_states: bool | None = None,
) -> tuple[_Uniform, _OptimizerSegment] | None:
    """One step under the segment probe, read per block. With ``optimizer`` (measured by an earlier step) the step
    stops after the backward pass and the optimizer segment is taken from it; None if the live bytes at the
    optimizer step differ from that step's (then the caller measures the whole step)."""
    probe = _segment_probe(trainer, device_type, rng_states)
    _run_marked(trainer, probe, probe_ref, whole_step=optimizer is None)
    marks, peak = probe.marks, probe.peak_bytes
    if optimizer is None:
        optimizer = _OptimizerSegment(marks["opt"].live, marks["end"].peak, marks["end"].flops - marks["opt"].flops,
                                      marks["end"].pointwise - marks["opt"].pointwise)
    elif marks["opt"].live != optimizer.live:
        return None
    else:  # the step stopped at the optimizer: its segment as the earlier step measured it
        marks["end"] = Mark(marks["opt"].live, optimizer.peak, marks["opt"].flops + optimizer.flops,
                            marks["opt"].pointwise + optimizer.pointwise)
        peak = max(peak, optimizer.peak)
    return _per_block(marks, n_blocks, peak), optimizer


def _segment_probe(trainer: Trainer, device_type: str, rng_states: bool | None) -> _Segments:
    """A segment probe with the trainer's state (weights, optimizer state, batch) counted as alive from the start."""
    probe = _Segments(device_type)
    if rng_states is not None:
        probe.count_rng_states = rng_states
    for tensor in trainer.state_tensors():
        probe.add(tensor)
    probe.segment_peak = probe.live_bytes
    return probe


def _run_marked(trainer: Trainer, probe: _Segments, probe_ref: list, whole_step: bool) -> None:
    """Run a step under ``probe``, which the blocks' marks (``install_marks``) find in ``probe_ref`` meanwhile:
    the whole step, marked ``opt`` where the optimizer step starts and ``end``, or up to the optimizer step."""
    probe_ref.append(probe)
    hook = None
    try:
        with probe:
            if whole_step:
                hook = trainer.optimizer.register_step_pre_hook(lambda *_: probe.mark("opt"))
                trainer.train_step()
                probe.mark("end")
            else:
                _forward_backward(trainer, probe.mark)
    finally:
        probe_ref.clear()
        if hook is not None:
            hook.remove()


def _per_block(m: dict[str, Mark], n_blocks: int, peak: int) -> _Uniform:
    """Each block's kept bytes, reach (its highest live bytes above what is below it), FLOPs and pointwise elements,
    forward plus backward, read off the marks (``f``/``e``: a block's forward begins/ends, ``b``: its output
    gradient arrives)."""
    base = m["f0"].live
    below = [m[f"f{i}"].live - base for i in range(n_blocks)] + [m[f"e{n_blocks - 1}"].live - base]
    kept, reach, flops, pointwise = [], [], [], []
    for i in range(n_blocks):
        backward_end = f"b{i - 1}" if i > 0 else "end"
        forward_peak = m[f"e{i}"].peak
        backward_peak = m[backward_end].peak if i > 0 else max(m["opt"].peak, m["end"].peak)  # embeddings' backward, optimizer
        seg_flops = (m[f"e{i}"].flops - m[f"f{i}"].flops) + (m[backward_end].flops - m[f"b{i}"].flops)
        seg_pointwise = (m[f"e{i}"].pointwise - m[f"f{i}"].pointwise) + (m[backward_end].pointwise - m[f"b{i}"].pointwise)
        top = max(forward_peak, backward_peak)
        if i == n_blocks - 1:
            top = max(top, m[f"b{i}"].peak)  # the head: from the top block's forward end to its output gradient
        kept.append(below[i + 1] - below[i])
        reach.append(top - below[i])
        flops.append(seg_flops)
        pointwise.append(seg_pointwise)
    return _Uniform(peak, m["f0"].peak, kept, reach, flops, pointwise)


MACHINE_BALANCE = {"cpu": 16.0, "cuda": 256.0}  # FLOP per byte of memory traffic at which a matmul and a streaming
# op take equal time: order of magnitude of a few-core x86 CPU (~100 GFLOP/s over ~6-20 GB/s) and of a data-centre
# GPU (A100 bf16 312 TFLOP/s / 2.0 TB/s = 156, H100 989 / 3.35 = 295). Fixed so plans are reproducible (below).


def pointwise_weight_for(device_type: str, dtype: torch.dtype = torch.float32) -> float:
    """FLOP-equivalents of one recomputed pointwise output element on ``device_type``: a fixed model, not a timing.

    A pointwise op reads an element and writes one (``2 x itemsize`` bytes) and is bound by memory bandwidth; a
    matmul is bound by arithmetic; so one element costs the time of ``2 x itemsize x MACHINE_BALANCE`` matmul
    FLOPs (float32 on a CPU: 128). It used to be timed at run time (a GeLU over a matmul, median of 5), which on a
    loaded 2-core machine ranged from 3 to 4,999 over 15 calls: the same budget then gave different plans from run
    to run and between a real run and its simulation. The weight only orders options whose recomputed FLOPs tie
    or nearly tie (``selective_op`` recomputes pointwise work only), so its order of magnitude is what matters;
    pass ``pointwise_weight=`` to a cost source to plan with another one (e.g. ``measure_pointwise_weight``)."""
    device_type = torch.device(device_type).type
    if device_type not in MACHINE_BALANCE:
        raise ValueError(f"no machine balance for device type {device_type!r}; known: {', '.join(MACHINE_BALANCE)}")
    itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
    return 2 * itemsize * MACHINE_BALANCE[device_type]


def measure_pointwise_weight(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """The pointwise weight timed on this device now: the time per element of a GeLU over the time per FLOP of a
    matmul (median of 5). A calibration tool, not the planner's default (``pointwise_weight_for``): it moves with the
    machine's load from run to run."""
    n = 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    x = torch.randn(4 * n * n, device=device, dtype=dtype)

    def median_time(fn) -> float:
        times = []
        for _ in range(5):
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn()
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return sorted(times)[2]

    matmul = median_time(lambda: a @ a) / (2 * n**3)
    gelu = median_time(lambda: torch.nn.functional.gelu(x, approximate="tanh")) / x.numel()
    return gelu / matmul


def measure_transfer_weight(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float:
    """FLOP-equivalents of one byte offloaded on this device: the time per byte of a device-to-host copy into
    pinned memory (what ``save_on_cpu(pin_memory=True)`` does) over the time per FLOP of a matmul, both measured
    now (median of 5). Without it an offload would look free to a FLOP objective."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"offload moves tensors from a GPU to host memory; there is no transfer to time on {device.type}")
    n = 2048
    a = torch.randn(n, n, device=device, dtype=dtype)
    src = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty(src.numel(), dtype=torch.uint8, pin_memory=True)

    def median_time(fn) -> float:
        times = []
        for _ in range(5):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return sorted(times)[2]

    per_flop = median_time(lambda: a @ a) / (2 * n**3)
    per_byte = median_time(lambda: dst.copy_(src, non_blocking=True)) / src.numel()
    return per_byte / per_flop


class MeasuredCosts:
    """``CostSource`` that measures real steps on a private model built like ``model`` (config, backend, device,
    dtype). Measuring runs with the caller's dispatch modes (probes, FLOP counters) disabled and the RNG state
    forked, so a plan chosen in the middle of a measured step changes neither its numbers nor its randomness."""

    def __init__(self, model: nn.Module, options: tuple[BlockOption, ...] | None = None, pointwise_weight: float | None = None,
                 blocks=None, anatomy=None, training: TrainingStep | None = None) -> None:
        """``blocks``/``anatomy``: a model of no family of ours (``apply_ac(..., blocks=...)``) is measured on a deep
        copy, its blocks found by name; without an anatomy only whole-block options (none, full, offload) exist,
        since a ``by_role`` option reads the roles of the block's matmuls from its anatomy. ``training``: the step
        measured (``activation.step.training_step``: the user's loss or step; default: the model's own)."""
        self.training = training if training is not None else training_step(model)
        param = next(model.parameters())
        self.device = param.device
        if self.device.type != "cpu":
            raise ValueError(
                f"measured plan costs need the exact cpu probe; a {self.device.type} model needs a simulated cost source"
            )
        self.options = options or default_options(self.device.type)
        if anatomy is None and blocks is not None:
            self.options = tuple(o for o in self.options if not o.reads_roles)
        with quiet():
            self.model, private_blocks = _private_copy(model, blocks)
            self.forwards = switchable_forwards(self.model, private_blocks)
            self.pointwise_weight = pointwise_weight if pointwise_weight is not None else pointwise_weight_for(self.device.type, param.dtype)
        self._trainer: Trainer | None = None
        self._probe_ref: list = []
        self._cache: dict[tuple[int, int], PlanCosts] = {}
        install_marks(self.model, self._probe_ref, private_blocks)

    _shared: dict = {}

    @classmethod
    def shared(cls, model: nn.Module, blocks=None, anatomy=None, training: TrainingStep | None = None) -> "MeasuredCosts":
        """One source per (config, backend, device, dtype) in this process, its costs cached per shape: every
        scenario of a budget sweep plans from the same measurements instead of measuring again. A model built
        from no card of ours gets its own source (keyed by the model and its step)."""
        param = next(model.parameters())
        training = training if training is not None else training_step(model)
        if _from_card(model):
            key = (model.config, model.backend, str(param.device), param.dtype)
        else:
            key = (id(model), str(param.device), param.dtype, training.call)
        if key not in cls._shared:
            cls._shared[key] = cls(model, blocks=None if _from_card(model) else blocks, anatomy=anatomy, training=training)
        return cls._shared[key]

    def costs(self, batch_size: int, seq_len: int) -> PlanCosts:
        if (batch_size, seq_len) not in self._cache:
            self._cache[batch_size, seq_len] = self._measure(batch_size, seq_len)
        return self._cache[batch_size, seq_len]

    def _measure(self, batch_size: int, seq_len: int) -> PlanCosts:
        with quiet():
            if self._trainer is None:
                self._trainer = StepTrainer.for_step(self.model, self.training, batch_size, seq_len)
            return segment_costs(
                self._trainer, self.forwards, self.options, self._probe_ref, batch_size, seq_len,
                pointwise_weight=self.pointwise_weight,
            )


def _from_card(model: nn.Module) -> bool:
    """A model of one of our families, rebuilt from its card (``models.build_model``)."""
    config = getattr(model, "config", None)
    return hasattr(config, "family") and hasattr(model, "backend")


def _private_copy(model: nn.Module, blocks) -> tuple[nn.Module, list | None]:
    """The model costs are measured on: rebuilt from its card, or a deep copy (its ``blocks`` found by name in the
    copy). None for blocks means "the copy's anatomy's"."""
    if _from_card(model):
        param = next(model.parameters())
        return build_model(model.config, model.backend, param.device, param.dtype, seed=0), None
    if blocks is None:
        return copy.deepcopy(model), None
    names = {id(m): name for name, m in model.named_modules()}
    missing = [i for i, b in enumerate(blocks) if id(b) not in names]
    if missing:
        raise ValueError(f"budget: blocks {missing} are not submodules of the model, so its copy cannot find them")
    private = copy.deepcopy(model)
    return private, [private.get_submodule(names[id(b)]) for b in blocks]


def segment_costs(
    trainer: Trainer, forwards: list, options: tuple[BlockOption, ...], probe_ref: list, batch_size: int, seq_len: int,
    *, device_type: str = "cpu", resident_bytes: int = 0, pointwise_weight: float = 0.0, source: str = "measured",
    warm_step: bool = True, optimizer_once: bool = False, rng_states: bool | None = None,
) -> PlanCosts:
    """``PlanCosts`` of ``trainer``'s model (its blocks' ``forwards`` switchable, marks installed by
    ``install_marks(model, probe_ref)``) at one shape: one warm step with no checkpointing (AdamW state exists,
    as in a measured step), then one step per option under the segment probe on ``device_type``. ``warm_step``
    False skips the warm step where nothing warms up (``meta``) and the optimizer state already exists;
    ``optimizer_once`` runs the optimizer step in the first option's step only (``_OptimizerSegment``: it is the
    same for every plan), which halves a ``meta`` step of a per-tensor AdamW (a CPU target).
    ``resident_bytes``: memory alive through the whole step that the probe cannot see (a ``cpu`` prediction made
    on ``meta``: AdamW's host step counters), added to every absolute number (``reach``, ``before``, peaks).
    ``rng_states``: count checkpointing's CPU RNG states (``probes.cpu``; default: on for a ``cpu`` probe), which
    a ``meta`` probe predicting a CPU needs to be told."""
    start = time.perf_counter()
    trainer.batch_size, trainer.seq_len = batch_size, seq_len
    n = len(forwards)
    _set(forwards, NONE)
    if warm_step or not trainer.optimizer.state:
        trainer.train_step()  # optimizer state exists (as in a measured step) and this shape is warm
    steps, optimizer = {}, None
    for option in options:
        _set(forwards, option)
        measured = _segment_step(trainer, n, probe_ref, device_type, optimizer if optimizer_once else None, rng_states)
        if measured is None:  # the optimizer step would start from other live bytes: measure it in this step too
            measured = _segment_step(trainer, n, probe_ref, device_type, rng_states=rng_states)
        steps[option], optimizer = measured[0], optimizer or measured[1]
    _set(forwards, NONE)
    none = steps[NONE]
    return PlanCosts(
        batch_size,
        seq_len,
        options,
        kept=[[steps[o].kept[i] for o in options] for i in range(n)],
        reach=[[steps[o].reach[i] + resident_bytes for o in options] for i in range(n)],
        flops=[[steps[o].flops[i] - none.flops[i] for o in options] for i in range(n)],
        pointwise=[[max(0, steps[o].pointwise[i] - none.pointwise[i]) for o in options] for i in range(n)],
        before=max(s.before for s in steps.values()) + resident_bytes,
        measured_peaks={o.name: s.peak + resident_bytes for o, s in steps.items()},
        pointwise_weight=pointwise_weight,
        source=source,
        seconds=time.perf_counter() - start,
    )


def _set(forwards: list, option: BlockOption) -> None:
    for forward in forwards:
        forward.option = option


@contextlib.contextmanager
def quiet():
    """No caller dispatch modes, forked RNG, grad enabled: measuring is invisible to the caller."""
    with _disable_current_modes(), torch.random.fork_rng(devices=[]), torch.enable_grad():
        yield
