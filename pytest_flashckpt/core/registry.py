"""The families, named once: memory probes, activation strategies, precisions and save strategies.

Each entry is a name and a one-line description (probes also the class that implements them and whether their
byte counts are exact; an activation strategy the function that plans it and where it cannot run; a save preset
its value on each of the three save axes). Option choices and help (``flashckpt simulate --strategy`` and
``--precision`` included), the config ``Literal`` types, validation messages, the closed forms and the report's
wording all derive from these tables, so a new member is registered here and implemented in its own module
(docs/architecture.md, "How to add ..."). Model families register themselves from their folders instead
(``models.families``): their names are the folders'.

Nothing here imports torch or another part of the project: config (the bottom layer) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    target: str  # "module:Class"; the class is built with ``device`` when ``takes_device``
    exact: bool  # byte counts deterministic to the byte (judged exactly by the gate)
    description: str
    takes_device: bool = False


PROBES: dict[str, ProbeSpec] = {
    spec.name: spec
    for spec in (
        ProbeSpec("cpu", "pytest_flashckpt.probes.cpu:LiveTensorProbe", True,
                  "live-tensor accounting (TorchDispatchMode), deterministic to the byte; it does not see 0-dim tensors made "
                  "from Python scalars outside the dispatcher, nor scratch memory inside one op (measured gap per step: "
                  "`python benchmarks/probe_gap.py`, reports/probe-gap.md)"),
        ProbeSpec("cuda", "pytest_flashckpt.probes.cuda:CudaAllocatorProbe", False,
                  "CUDA caching-allocator peak after reset_peak_memory_stats", takes_device=True),
        ProbeSpec("nvml", "pytest_flashckpt.probes.nvml:NvmlProbe", False,
                  "device memory sampled with NVML in a thread (a lower bound; CUDA context reported apart)", takes_device=True),
        ProbeSpec("rss", "pytest_flashckpt.probes.rss:RssProbe", False,
                  "process resident set size (a sanity check, not tensor memory)"),
    )
}
PROBE_NAMES: tuple[str, ...] = tuple(PROBES)


def is_exact_probe(name: str | None) -> bool:
    spec = PROBES.get(name or "")
    return spec is not None and spec.exact


def default_probe_name(device_type: str) -> str:
    """``auto``: the allocator probe on a GPU, exact accounting on the CPU."""
    return "cuda" if device_type == "cuda" else "cpu"


@dataclass(frozen=True)
class ActivationStrategySpec:
    """An activation strategy: its name, what it does, the function that plans it and where it cannot go.

    ``plan`` is ``"module:function"``; the function is called as ``plan(config, n_blocks, context)`` with the
    scenario's ``ActivationConfig`` and an ``activation.plan.PlanContext`` and returns one ``BlockOption`` per block
    (``activation.plan.plan_for`` resolves it). Everything else follows from that plan: the FLOP closed form counts
    the replays of its blocks, the analytic model its kept bytes. ``not_simulated``: why ``flashckpt simulate`` (the
    step on meta) refuses it ("" when it runs there); ``takes_budget``: its plan needs ``activation.budget`` and the
    input shape, so it is simulated only with a budget (``--budget``) and has no closed-form FLOPs.

    Three simulators take only strategies whose row says they can (off by default: a new strategy opts in):

    - ``runs_on_fake_ranks``: the real engine under fake mode lays out a rank with it (``simulate.layouts``:
      ``flashckpt simulate --tp/--world-size``, a suite's ``simulate.world_size``; ``simulate.stage_layouts``:
      ``--pp/--cp``). Only for a plan that repeats with depth (the engine reads a deep card's rank off the line
      through shallower simulated ones), that the meta step simulates (no ``not_simulated``) and that needs no
      measured budget (not ``takes_budget``: planned per input shape). Otherwise refused under ``--tp``/``--pp``/
      ``--cp`` naming this attribute, and answered by the modelled FSDP route at tp 1.
    - ``fit_order``: ``flashckpt fit`` searches it, at this place of its default ``--strategies`` (least
      recomputation first; None: not searched, and ``--strategies`` refuses it naming this attribute). Fit simulates
      each candidate's rank on fake ranks, so it needs ``runs_on_fake_ranks``, and times its compute by the FLOP
      closed form and the tensor-parallel collectives of replayed blocks by the block options of its plan
      (``fit.time_model.replay_counts``), so nothing in fit names a strategy.
    - ``simulated_compiled``: how ``simulate.compiled`` runs it in a ``torch.compile``'d step (a key of
      ``COMPILED_SIMULATIONS``; "" not simulated compiled: refused naming this attribute).

    ``checkpoints_whole_blocks``: its plan checkpoints whole blocks with ``torch.utils.checkpoint`` and no per-op
    policy, so ``compile.ac_wrapper: outside`` can put that checkpoint around each compiled block
    (``config.axes.CompileConfig``; a policy that reads each op cannot see the ops of a compiled call).
    ``compiles_outside_only``: its wrapper is saved-tensor hooks, which train compiled only outside the compiled block
    (``compile.ac_wrapper: outside``, one process): entered inside, Dynamo breaks the graph at them, and around a
    whole compiled model they let go of far less (reports/spike-compiled-offload.md).
    ``compiles_inside_tensor_parallel``: a compiled tensor-parallel block trains with its wrapper traced inside the
    compiled region on the torch this project pins (loss and every gradient against one eager process,
    tests/distributed/test_compiled_tensor_parallel.py); torch 2.13's AOTAutograd fails in backward for a whole-block
    checkpoint there, which trains with ``compile.ac_wrapper: outside`` instead (reports/spike-compiled-layouts.md)."""

    name: str
    description: str
    plan: str
    not_simulated: str = ""
    takes_budget: bool = False
    runs_on_fake_ranks: bool = False
    fit_order: int | None = None
    simulated_compiled: str = ""
    checkpoints_whole_blocks: bool = False
    compiles_outside_only: bool = False
    compiles_inside_tensor_parallel: bool = False


_PLANS = "pytest_flashckpt.activation.plan"

# how simulate.compiled runs a strategy in a compiled step (``ActivationStrategySpec.simulated_compiled``); the
# compiled simulator's list is in this order, then the registry's
COMPILED_SIMULATIONS: dict[str, str] = {
    "traced": "its checkpoint wrapper is traced by Dynamo inside each compiled region (selective_op's policy reads a "
              "matmul's role from the traced node)",
    "partitioner": "torch's activation_memory_budget: the min-cut partitioner decides what is recomputed",
    "policies": "the budget planner's compiled plan: its per-block selective-checkpoint policies, passed in",
}

ACTIVATION_STRATEGIES: dict[str, ActivationStrategySpec] = {}


def register_activation_strategy(spec: ActivationStrategySpec) -> ActivationStrategySpec:
    """Add a strategy (a name already taken is an error): every option choice, the config ``Literal`` (for a
    strategy registered before ``config.scenario`` is imported), the simulator's choices, FLOPs and the report
    read this table."""
    if spec.name in ACTIVATION_STRATEGIES:
        raise ValueError(f"activation strategy {spec.name!r} is registered already")
    if spec.runs_on_fake_ranks and (spec.not_simulated or spec.takes_budget):
        raise ValueError(f"activation strategy {spec.name!r}: runs_on_fake_ranks needs a plan the meta step simulates "
                         "without a budget; drop runs_on_fake_ranks, not_simulated or takes_budget")
    if spec.fit_order is not None and not spec.runs_on_fake_ranks:
        raise ValueError(f"activation strategy {spec.name!r}: fit_order {spec.fit_order} needs runs_on_fake_ranks "
                         "(fit simulates each candidate's rank on fake ranks); set it or drop fit_order")
    if spec.simulated_compiled and spec.simulated_compiled not in COMPILED_SIMULATIONS:
        raise ValueError(f"activation strategy {spec.name!r}: simulated_compiled {spec.simulated_compiled!r} is "
                         f"unknown; use one of {', '.join(COMPILED_SIMULATIONS)} or \"\" (not simulated compiled)")
    ACTIVATION_STRATEGIES[spec.name] = spec
    return spec


for _spec in (
    ActivationStrategySpec("none", "nothing recomputed (the reference)", f"{_PLANS}:keep_every_block",
                           runs_on_fake_ranks=True, fit_order=0, simulated_compiled="traced",
                           compiles_inside_tensor_parallel=True),
    ActivationStrategySpec("full", "every block recomputed in the backward pass; only block inputs kept",
                           f"{_PLANS}:recompute_every_block", runs_on_fake_ranks=True, fit_order=3,
                           simulated_compiled="traced", checkpoints_whole_blocks=True),
    ActivationStrategySpec("every_k", "blocks 0, k, 2k, ... recomputed", f"{_PLANS}:recompute_every_kth_block",
                           runs_on_fake_ranks=True, fit_order=2, simulated_compiled="traced",
                           checkpoints_whole_blocks=True),
    ActivationStrategySpec("selective_op", "matmul and attention outputs kept, pointwise ops recomputed "
                           "(a selective-checkpoint policy)", f"{_PLANS}:selective_op_blocks",
                           runs_on_fake_ranks=True, fit_order=1, simulated_compiled="traced",
                           compiles_inside_tensor_parallel=True),
    ActivationStrategySpec("offload", "every block's saved tensors moved to pinned CPU memory (GPU only)",
                           f"{_PLANS}:offload_every_block",
                           not_simulated="offload copies activations to pinned host memory, which the step on the "
                           "meta device does not model; measure it on a GPU",
                           compiles_outside_only=True),
    ActivationStrategySpec("budget", "per input shape, the plan with the least recomputation whose measured peak "
                           "fits activation.budget", f"{_PLANS}:planned_for_budget", takes_budget=True,
                           simulated_compiled="policies"),
    ActivationStrategySpec("compile_budget", "torch.compile's own knob: its partitioner keeps saved activations within "
                           "activation.budget, a fraction of its estimate (activation_memory_budget; compiled scenarios only)",
                           f"{_PLANS}:keep_every_block",
                           not_simulated="compile_budget is torch.compile's partitioner deciding what to recompute, which the "
                           "eager step on the meta device does not model (not simulated yet); measure it with compile.scope set",
                           simulated_compiled="partitioner", compiles_inside_tensor_parallel=True),
):
    register_activation_strategy(_spec)


def simulated_strategies() -> tuple[str, ...]:
    """The strategies ``flashckpt simulate`` runs (every registered one without a ``not_simulated`` reason)."""
    return tuple(name for name, spec in ACTIVATION_STRATEGIES.items() if not spec.not_simulated)


def fake_rank_strategies() -> tuple[str, ...]:
    """The strategies the real engine under fake mode lays out a rank with (``runs_on_fake_ranks``), in the
    registry's order."""
    return tuple(name for name, spec in ACTIVATION_STRATEGIES.items() if spec.runs_on_fake_ranks)


def whole_block_strategies() -> tuple[str, ...]:
    """The strategies that checkpoint whole blocks (``checkpoints_whole_blocks``): what ``compile.ac_wrapper:
    outside`` is built for, in the registry's order."""
    return tuple(name for name, spec in ACTIVATION_STRATEGIES.items() if spec.checkpoints_whole_blocks)


def outside_only_strategies() -> tuple[str, ...]:
    """The strategies that train compiled only with their wrapper outside the compiled block
    (``compiles_outside_only``), in the registry's order."""
    return tuple(name for name, spec in ACTIVATION_STRATEGIES.items() if spec.compiles_outside_only)


def tensor_parallel_compiled_strategies() -> tuple[str, ...]:
    """The strategies a compiled tensor-parallel block trains with, the wrapper inside the compiled region
    (``compiles_inside_tensor_parallel``), in the registry's order."""
    return tuple(name for name, spec in ACTIVATION_STRATEGIES.items() if spec.compiles_inside_tensor_parallel)


def fit_strategies() -> tuple[str, ...]:
    """The strategies ``flashckpt fit`` searches by default, by ``fit_order`` (least recomputation first)."""
    searched = [spec for spec in ACTIVATION_STRATEGIES.values() if spec.fit_order is not None]
    return tuple(spec.name for spec in sorted(searched, key=lambda spec: spec.fit_order))


def compiled_strategies() -> tuple[str, ...]:
    """The strategies ``simulate.compiled`` runs in a compiled step: by how (``COMPILED_SIMULATIONS``' order), then
    in the registry's order."""
    kinds = list(COMPILED_SIMULATIONS)
    simulated = [spec for spec in ACTIVATION_STRATEGIES.values() if spec.simulated_compiled]
    return tuple(spec.name for spec in sorted(simulated, key=lambda spec: kinds.index(spec.simulated_compiled)))


NOT_ON_FAKE_RANKS = ("its registry row does not set runs_on_fake_ranks: the engine reads a deep card's rank off a "
                     "plan that repeats with depth, simulated on meta without a budget")


PRECISIONS: dict[str, str] = {
    "pure": "everything in the dtype",
    "mixed": "float32 master weights, gradients and AdamW state; compute in the dtype (autocast)",
}

# -- saves: three axes, and the seed's strategy names as presets of them ---------------------------------------
NO_SAVE = "none"  # the strategy name of a scenario that saves nothing

SAVE_LAYOUTS: dict[str, str] = {
    "file": "every tensor in one file (format: torch or safetensors)",
    "layerwise": "one file per block plus rest, under layer_checkpoint_dir (default layers)",
    "selected": "a full base first, then only the selected tensors (select_params) and their optimizer state",
    "dcp": "a torch.distributed.checkpoint folder (one per block with layer_checkpoint_dir)",
}
SAVE_STAGINGS: dict[str, str] = {
    "blocking": "written and committed while training waits",
    "background": "snapshot at the save call, written by a background thread (dcp: torch's dcp.async_save)",
    "overlapped": "background, the snapshot copy running during the next step (optimizer.step waits for it)",
}
SAVE_SCHEDULES: dict[str, str] = {
    "every": "a save every save_interval steps",
    "memory_aware": "every save_interval steps, deferred while memory in use is at or above mem_threshold "
                    "(forced after max_defer_steps)",
}


@dataclass(frozen=True)
class SavePreset:
    """A save strategy name: one value per axis, and what it means."""

    name: str
    layout: str  # a key of SAVE_LAYOUTS
    staging: str  # a key of SAVE_STAGINGS
    schedule: str  # a key of SAVE_SCHEDULES
    description: str


SAVE_PRESETS: dict[str, SavePreset] = {
    preset.name: preset
    for preset in (
        SavePreset("sync", "file", "blocking", "every", "one file written in the training loop (the reference save)"),
        SavePreset("async", "file", "background", "every", "snapshot into a staging area, then written by a background thread"),
        SavePreset("dcp", "dcp", "blocking", "every", "torch.distributed.checkpoint (optionally its async_save)"),
        SavePreset("selective", "selected", "blocking", "every", "selected tensors saved on top of a full base checkpoint"),
        SavePreset("layerwise", "layerwise", "blocking", "every", "one file per block plus the rest"),
        SavePreset("scheduled", "file", "blocking", "memory_aware", "saves deferred while memory in use is above a threshold"),
    )
}
SAVE_DEFAULT = SAVE_PRESETS["sync"]  # the axes a scenario gets for what it does not set


def save_strategy_names() -> dict[str, str]:
    """Every name ``checkpoint.strategy`` accepts, with its meaning (``none`` and the presets)."""
    return {NO_SAVE: "no checkpoint saved", **{name: p.description for name, p in SAVE_PRESETS.items()}}


def derived_save_name(layout: str, staging: str, schedule: str) -> str:
    """The strategy name of axes that no preset names: ``<layout>-<staging>-<schedule>`` (``dcp-background-every``);
    it depends on the three values only, so it never changes when a preset is added."""
    return f"{layout}-{staging}-{schedule}"


def describe(table: dict) -> str:
    """``a: what a does; b: ...``: choices with their meaning, for help texts and error messages (a table of
    strings, or of specs with a ``description``)."""
    return "; ".join(f"{name}: {getattr(text, 'description', text)}" for name, text in table.items())
