"""Scenario axes reserved for the features the next issues add: the layout mesh (issue 32) and torch.compile
(issue 33, built for its measured values: ``CompileConfig``). (The norm, optimizer and loss implementations are built: ``step_impl``, ``config.step_impl``; the MoE
routing assumption is the MoE card's ``routing``, ``config.cards.moe``.)

Each is a small typed dataclass whose defaults mean "what runs today" (FSDP over every rank, eager). Values an
issue has built are accepted (``layout: {tp: 2}``, ``compile: {scope: block}``); a value not built yet is refused,
naming the key and the issue that builds it, before anything runs: a scenario never claims a layout, or a compile
mode it was not measured with.

Today's values are left out of a scenario's fingerprint (``config.fingerprint``): reserving an axis, or writing
its default in a suite, changes no stored baseline's comparability. When an issue builds an axis, it widens the
``Literal`` (or the range) here and drops the refusal for the values it implements; a non-default value then
enters the fingerprint, so a baseline measured without it reads "not comparable".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from pytest_flashckpt.config.layout import PipelineSchedule
from pytest_flashckpt.core.registry import (outside_only_strategies, tensor_parallel_compiled_strategies,
                                            whole_block_strategies)


class NotBuiltYet(ValueError):
    """An axis value reserved for a feature that is not built yet (the message names the key and the issue)."""


@dataclass(frozen=True)
class LayoutMesh:
    """How the ranks of a ``world_size`` scenario split the model (issue 32, docs/layouts.md): FSDP2 shards
    (``dp_shard``; None: the ranks the other axes leave), tensor + sequence parallel (``tp``, torch's
    ``parallelize_module`` on a 2D ``DeviceMesh``, ``distributed.tensor_parallel``), and pipeline stages (``pp``,
    torch's ``torch.distributed.pipelining`` run by ``schedule`` over ``microbatches`` per step, ``stages_per_rank``
    stages on each pipeline rank; ``config.layout.PipelineSchedule``) and context parallel (``cp``: the sequence
    split over the ranks, torch's ring attention, ``distributed.context_parallel``; FSDP2 shards over
    ``dp_shard x cp``, tensor parallel inside, inside each pipeline stage with ``pp``) and HSDP replicas (``dp_replicate``: FSDP2 over the
    2D ``(dp_replicate, dp_shard)`` mesh, ``(dp_replicate, dp_shard_cp)`` with cp, each stage's with pp; gradients
    reduce-scattered in the shard group and all-reduced over the replicas).

    Built: ``dp_replicate`` x ``dp_shard`` x ``cp`` x ``tp`` measured on the ranks of a run (eager, or compiled per
    block) and simulated by the engine; ``pp`` simulated, and measured on ranks eager or compiled per block
    (``config.scenario.MEASURED_PIPELINE_STRATEGIES``), tensor or context parallel inside the stages or not. A simulated ``cp``
    rank alone in pure precision is the CUDA-op ring on meta, labelled modelled (``simulate.context_parallel``).
    The pipeline keys apply with ``pp`` > 1 only; ``microbatches`` None means one per stage, the fewest torch's
    1F1B schedules run."""

    dp_shard: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    schedule: str = "1f1b"
    microbatches: int | None = None
    stages_per_rank: int = 1
    dp_replicate: int = 1  # HSDP: replicas of the dp_shard group (FSDP2 over the 2D (dp_replicate, dp_shard) mesh)

    PIPELINE_KEYS = ("schedule", "microbatches", "stages_per_rank")
    RANK_KEYS = ("dp_replicate", "dp_shard", "tp", "pp", "cp")

    def __post_init__(self) -> None:
        for key in (*self.RANK_KEYS, "microbatches", "stages_per_rank"):
            value = getattr(self, key)
            if value is None and key in ("dp_shard", "microbatches"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                what = "number of ranks" if key in self.RANK_KEYS else "integer"
                raise ValueError(f"layout.{key} must be a positive {what}, got {value!r}")
        if self.pp == 1:
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            set_keys = [key for key in self.PIPELINE_KEYS if getattr(self, key) != defaults[key]]
            if set_keys:
                raise ValueError(f"layout.{set_keys[0]} applies to pipeline stages: set layout.pp above 1, or drop "
                                 f"layout.{set_keys[0]}")
            return
        try:
            self.pipeline_schedule()
        except ValueError as exc:
            raise ValueError(f"layout: {exc}") from None

    @property
    def tensor_parallel(self) -> bool:
        return self.tp > 1

    def pipeline_schedule(self) -> PipelineSchedule:
        """How the stages run (``pp`` > 1): the schedule, microbatches (None: one per stage) and stages per rank."""
        microbatches = self.pp * self.stages_per_rank if self.microbatches is None else self.microbatches
        return PipelineSchedule(self.schedule, microbatches, self.stages_per_rank)

    def ranks(self, world_size: int) -> tuple[int, int]:
        """``(dp_shard, tp)`` for ``world_size`` ranks (``pp`` stages, ``cp`` groups and ``dp_replicate`` replicas of
        ``dp_shard x tp`` each); ValueError naming the key and the fix when they do not multiply to it."""
        others = self.pp * self.cp * self.dp_replicate
        extra = "".join(f" x {key} {getattr(self, key)}" for key in ("pp", "cp", "dp_replicate") if getattr(self, key) > 1)
        if world_size % (self.tp * others):
            raise ValueError(f"layout.tp {self.tp}{extra} does not divide world_size {world_size}; choose axes that "
                             f"divide the ranks (or world_size = dp_shard x tp{extra})")
        dp_shard = world_size // (self.tp * others) if self.dp_shard is None else self.dp_shard
        if dp_shard * self.tp * others != world_size:
            raise ValueError(f"layout.dp_shard {dp_shard} x tp {self.tp}{extra} = {dp_shard * self.tp * others} "
                             f"ranks, but world_size is {world_size}; make dp_shard x tp{extra} equal world_size (or "
                             "drop dp_shard: the rest of the ranks)")
        return dp_shard, self.tp


@dataclass(frozen=True)
class CompileConfig:
    """``torch.compile`` around the step (issue 33, docs/compile.md): none (eager, today), each transformer block
    (``block``: torchtitan's way, the activation strategy's wrapper inside the compiled block), or the whole model
    (``model``). ``mode`` and ``fullgraph`` are ``torch.compile``'s; ``dynamic`` too (None: torch's default, which
    marks a dimension dynamic when a second shape is seen; each compiled scenario compiles its own model, so rows
    of different sequence lengths never recompile one another's graphs).

    Built: ``mode: default``; the other modes (CUDA graphs, autotuning) are refused until measured.

    ``ac_wrapper`` (scope ``block``): where a checkpointing strategy's wrapper (``torch.utils.checkpoint``) sits, as
    torch documents both: ``inside`` the compiled block (torchtitan's way: compile traces the checkpoint and its
    partitioner decides what the block saves), or ``outside`` (each checkpointed block's own forward compiled, the
    checkpoint around the compiled call in eager: the block's saved tensors are dropped after its forward region and
    the region runs again in backward; ``compile_step.compile_model``). Outside is built for the strategies that
    checkpoint whole blocks (``registry.whole_block_strategies``: ``full``, ``every_k``); it is how they train
    compiled under tensor parallel on torch 2.13. It is also the only place ``offload``'s saved-tensor hooks train
    compiled (``registry.outside_only_strategies``: one process, the hooks around each compiled block, keeping
    strides; reports/spike-compiled-offload.md)."""

    scope: Literal["none", "block", "model"] = "none"
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    fullgraph: bool = False
    dynamic: bool | None = None
    ac_wrapper: Literal["inside", "outside"] = "inside"

    BUILT_MODES = ("default",)

    def __post_init__(self) -> None:
        if self.mode not in self.BUILT_MODES:
            raise NotBuiltYet(f"compile.mode: {self.mode!r} is not built yet (issue 33 measures "
                              f"{', '.join(self.BUILT_MODES)}); drop compile.mode or set it to 'default'")
        if self.scope == "none":
            extra = [f.name for f in dataclasses.fields(self) if f.name != "scope" and getattr(self, f.name) != f.default]
            if extra:
                raise ValueError(f"compile.{extra[0]} is set but compile.scope is 'none' (eager); set compile.scope "
                                 f"to block or model, or drop compile.{extra[0]}")
        if self.ac_wrapper == "outside" and self.scope != "block":
            raise ValueError(f"compile.ac_wrapper: outside places the checkpoint around each compiled block, but "
                             f"compile.scope is {self.scope!r}; set compile.scope to block, or drop compile.ac_wrapper")

    @property
    def enabled(self) -> bool:
        return self.scope != "none"

    def check_scenario(self, strategy: str, measure: tuple[str, ...], world_size: int, tensor_parallel: bool = False) -> None:
        """ValueError for what a compiled scenario cannot be (or a compile-only strategy without compile), naming
        the key and the fix; called by ``Scenario`` once its strategies and passes are resolved."""
        if not self.enabled:
            if strategy == "compile_budget":
                raise ValueError("activation.strategy compile_budget is torch.compile's activation_memory_budget: "
                                 "set compile.scope to block or model")
            return
        whole_blocks, inside_tp = whole_block_strategies(), tensor_parallel_compiled_strategies()
        outside_only = outside_only_strategies()
        if self.ac_wrapper == "outside" and strategy not in (*whole_blocks, *outside_only, "none"):  # none: a reference
            raise NotBuiltYet(f"compile.ac_wrapper: outside with activation.strategy {strategy} is not built (the "
                              f"wrapper around a compiled block is built for {', '.join((*whole_blocks, *outside_only))}:"
                              " a whole block checkpointed or offloaded); use one of those, or drop compile.ac_wrapper")
        if strategy in outside_only:
            self._check_outside_only(strategy, world_size)
        if (world_size > 1 and tensor_parallel and self.ac_wrapper == "inside"
                and strategy not in inside_tp):
            outside = (" or compile.ac_wrapper: outside (the checkpoint around the compiled block)"
                       if strategy in whole_blocks else "")
            raise NotBuiltYet(f"compile.scope: {self.scope!r} with layout.tp > 1 and activation.strategy {strategy} "
                              "is not built: torch's checkpoint wrapper in a compiled tensor-parallel block fails in "
                              "backward on torch 2.13 (a DeviceMesh among AOTAutograd's saved tensors, "
                              "reports/spike-compiled-layouts.md); use activation.strategy "
                              f"{' or '.join(inside_tp)}{outside}, drop compile, or drop layout.tp")
        if world_size > 1 and (self.scope != "block" or strategy == "budget"):
            raise NotBuiltYet(f"compile.scope: {self.scope!r} with activation.strategy {strategy} and world_size "
                              f"{world_size} is not built (ranks compile each block before fully_shard, torchtitan's "
                              "order, with a fixed strategy or compile_budget); use compile.scope block and a fixed "
                              "strategy, or world_size: 1")
        if "checkpoint" in measure:
            raise NotBuiltYet("compile.scope with a checkpoint pass is not built yet (issue 33 measures the compiled "
                              "step: memory, timing, flops); drop the checkpoint settings or compile")
        if strategy == "budget" and self.scope != "block":
            raise NotBuiltYet(f"compile.scope {self.scope!r} with activation.strategy budget is not built yet (the "
                              "compiled plan is one selective-checkpoint policy per block, "
                              "activation.budget.compile_policy); set compile.scope to block, or use compile_budget")

    def _check_outside_only(self, strategy: str, world_size: int) -> None:
        """A strategy of saved-tensor hooks compiles only around each compiled block, in one process; each refusal
        carries what reports/spike-compiled-offload.md measured."""
        if self.scope == "model":
            raise ValueError(f"compile.scope: model with activation.strategy {strategy}: its saved-tensor hooks "
                             "would be entered inside the compiled model, where they break Dynamo's graph, and "
                             "around a whole compiled model they let go of far less than around each block (on the "
                             "tiny card the peak rose above no offload; reports/spike-compiled-offload.md); set compile.scope: block and "
                             "compile.ac_wrapper: outside")
        if self.ac_wrapper != "outside":
            raise ValueError(f"compile.scope: block with activation.strategy {strategy} needs compile.ac_wrapper: "
                             "outside: its saved-tensor hooks entered inside a compiled block break Dynamo's graph "
                             "there (reports/spike-compiled-offload.md); set compile.ac_wrapper: outside")
        if world_size > 1:
            raise NotBuiltYet(f"compile.scope with activation.strategy {strategy} and world_size {world_size} is not "
                              "built (compiled offload is measured in one process only); use world_size: 1, or "
                              "drop compile")


RESERVED_AXES: dict[str, type] = {"layout": LayoutMesh, "compile": CompileConfig}
"""Scenario field -> its axis type; each field's default is its type's defaults (today's values)."""


def is_today(value: object) -> bool:
    """True when a reserved axis holds today's values (every field at its default)."""
    return value == type(value)()
