"""A scenario: one model x attention kernel x activation strategy x save strategy to measure.

Suite files and the ``flashckpt`` fixture build these; the runner measures them. The article's YAML keys are
accepted as written there (``gradient_checkpointing``, ``checkpoint_level: layer``, ``layer_checkpoint_dir``,
``async_save``, ``select_params``, ``save_interval``, ``mem_threshold``, ``max_keep``) and folded into the typed
fields: every scenario has exactly one activation strategy, and one save (three axes, ``SaveConfig.axes``, named by
``SaveConfig.strategy``; ``config.save_axes``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from pytest_flashckpt.config import save_axes
from pytest_flashckpt.config.axes import CompileConfig, LayoutMesh, NotBuiltYet
from pytest_flashckpt.config.layout import Layout
from pytest_flashckpt.config.save_axes import SaveAxes
from pytest_flashckpt.config.typed import to_plain
from pytest_flashckpt.config.step_impl import StepImpl
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES, NO_SAVE, SAVE_LAYOUTS, SAVE_PRESETS, SAVE_SCHEDULES, SAVE_STAGINGS

# the names live in pytest_flashckpt.core.registry (with their descriptions); Literal[tuple] is Literal[*names]
ActivationStrategy = Literal[tuple(ACTIVATION_STRATEGIES)]  # type: ignore[valid-type]
SaveLayout = Literal[tuple(SAVE_LAYOUTS)]  # type: ignore[valid-type]
SaveStaging = Literal[tuple(SAVE_STAGINGS)]  # type: ignore[valid-type]
SaveSchedule = Literal[tuple(SAVE_SCHEDULES)]  # type: ignore[valid-type]
MeasurePass = Literal["memory", "timing", "flops", "checkpoint"]  # the passes a scenario runs

REFERENCE_SAVES = 3  # a reference sync save pass makes at most this many saves (Scenario.reference)


def _check_inside_checkpoint(key: str, value: object) -> None:
    """A folder a suite names for files inside each checkpoint must stay inside it: relative, no ``..`` (block files
    written outside the checkpoint would escape its manifest, its hash check and its cleanup)."""
    parts = PurePosixPath(value).parts if isinstance(value, str) else ()
    if not isinstance(value, str) or not value.strip() or "\\" in value or "\x00" in value:
        problem = "a folder name such as 'layers'"
    elif PurePosixPath(value).is_absolute() or value.startswith("~"):
        problem = "relative (it is an absolute path)"
    elif ".." in parts:
        problem = "free of '..' (it climbs out of the checkpoint folder)"
    elif parts in ((), (".",)):
        problem = "a sub-folder, not the checkpoint folder itself"
    else:
        return
    raise ValueError(f"{key}: {value!r} must be {problem}; it names a folder inside each checkpoint, e.g. {key}: layers")


def _set(obj, **values) -> None:
    for name, value in values.items():
        object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class ActivationConfig:
    """How activations are kept for the backward pass."""

    strategy: ActivationStrategy = "none"  # see registry.ACTIVATION_STRATEGIES
    k: int = 2  # every_k: checkpoint blocks 0, k, 2k, ...
    save_ops: tuple[str, ...] | None = None  # selective_op: aten overloads whose outputs are saved (None = matmuls + attention)
    # budget: the step's peak to fit, per input shape: a size ("6 GiB", bytes), a fraction in (0, 1] of the
    # no-checkpointing peak (0.6), "min" (the smallest achievable peak) or "min + 30%" (of the way to no checkpointing)
    # compile_budget: torch.compile's activation_memory_budget, a fraction in [0, 1]
    budget: int | float | str | None = None

    ALIASES = {"gradient_checkpointing": ("strategy", lambda on: {"strategy": "full" if _flag(on) else "none"})}

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"activation.k must be a positive number of blocks, got {self.k}")
        if self.strategy == "budget":
            if self.budget is None:
                raise ValueError(
                    "activation.budget is required with strategy 'budget': a size ('6 GiB'), a fraction of the "
                    "no-checkpointing peak (0.6), 'min' or 'min + 30%'"
                )
            from pytest_flashckpt.config.budget import BudgetSpec

            BudgetSpec.parse(self.budget)  # ValueError naming activation.budget
        elif self.strategy == "compile_budget":  # torch's activation_memory_budget: a fraction of its own estimate
            if isinstance(self.budget, bool) or not isinstance(self.budget, (int, float)) or not 0 <= self.budget <= 1:
                raise ValueError(f"activation.budget for strategy compile_budget is torch.compile's activation_memory_budget, "
                                 f"a fraction in [0, 1] (1: torch's default, 0: recompute all it can), got {self.budget!r}")
        elif self.budget is not None:
            raise ValueError(
                f"activation.budget is set but activation.strategy is {self.strategy!r}; set strategy: budget or drop budget"
            )


# keys of how the checkpoint pass measures a save, not of the save: refused by the checkpoint API (checkpoint.api)
MEASUREMENT_ONLY_SAVE_KEYS = ("saves", "time_lost_rounds", "wait_for_write")


@dataclass(frozen=True)
class SaveConfig:
    """How training state is saved: three axes (``layout``, ``staging``, ``schedule``), set one by one or filled by
    a preset (``strategy``); the article's keys set one axis each (``config.save_axes`` has the rules). After
    construction ``strategy`` is the name reports show (the preset's, or one derived from the axes) and ``axes``
    the values the checkpointer composes the save from."""

    strategy: str | None = None  # a preset (registry.SAVE_PRESETS), none; unset: named from the settings
    layout: SaveLayout | None = None  # which files (registry.SAVE_LAYOUTS); unset: the preset's
    staging: SaveStaging | None = None  # what training waits for (registry.SAVE_STAGINGS); unset: the preset's
    schedule: SaveSchedule | None = None  # when a save is taken (registry.SAVE_SCHEDULES); unset: the preset's
    format: Literal["torch", "safetensors"] = "torch"  # tensor files of the file, layerwise and selected layouts
    save_interval: int = 1  # steps between saves
    async_save: bool = False  # article key: staging background (dcp: torch's async_save)
    max_keep: int | None = None  # keep the newest N complete checkpoints
    select_params: bool | str | list[str] | None = None  # layout selected: true = non-embedding (article); "trainable"; glob patterns
    mem_threshold: float | None = None  # schedule memory_aware: save only while memory in use is under this fraction of capacity
    mem_basis: Literal["capacity", "peak"] = "capacity"  # memory_aware: capacity = device/host memory; peak = this scenario's measured peak step memory (live tensor bytes vs it)
    max_defer_steps: int = 10  # memory_aware: a deferred save is forced after this many steps
    layer_checkpoint_dir: str | None = None  # layerwise: folder (relative to the checkpoint) for per-block files
    saves: int = 3  # how many saves the checkpoint pass measures
    time_lost_rounds: int = 3  # interleaved rounds of K steps with one save vs K without (K = save_interval); 0: not measured
    wait_for_write: bool = False  # measured save loop only: wait, untimed, for the write in flight before a save falls due
    axes: SaveAxes = field(init=False, compare=False)  # resolved in __post_init__

    def __post_init__(self) -> None:
        base_layout = SAVE_PRESETS[self.strategy].layout if self.strategy in SAVE_PRESETS else "file"
        given = save_axes.settings_of(self.layout, self.staging, self.schedule, self.async_save, self.select_params,
                                      self.mem_threshold, self.layer_checkpoint_dir, base_layout)
        name, axes = save_axes.resolve(self.strategy, given)
        _set(self, strategy=name, axes=axes)
        if name != NO_SAVE:
            save_axes.check_combination(axes, self.schedule, self.format, self.layer_checkpoint_dir, self.mem_threshold)
        if axes.layout == "selected" and self.select_params in (None, False):
            _set(self, select_params=True)
        if self.save_interval <= 0:
            raise ValueError(f"save_interval must be a positive number of steps, got {self.save_interval}")
        if self.max_keep is not None and self.max_keep <= 0:
            raise ValueError(f"max_keep must be at least 1 (the newest checkpoint is always kept), got {self.max_keep}")
        if self.mem_threshold is not None and not 0.0 < self.mem_threshold <= 1.0:
            raise ValueError(f"mem_threshold is a fraction of memory capacity in (0, 1], got {self.mem_threshold}")
        if self.mem_basis == "peak" and self.mem_threshold is None:
            raise ValueError("mem_basis: peak needs mem_threshold (a fraction of the measured peak step memory)")
        if self.max_defer_steps < 0:
            raise ValueError(f"max_defer_steps must be >= 0, got {self.max_defer_steps}")
        if self.time_lost_rounds < 0:
            raise ValueError(f"time_lost_rounds must be >= 0 (0 skips the time-lost measurement), got {self.time_lost_rounds}")
        if self.saves <= 0:
            raise ValueError(f"saves must be positive, got {self.saves}")
        if self.wait_for_write and not axes.background:
            raise ValueError(
                f"wait_for_write waits for a background write, but the {name} save writes in the save call (staging "
                f"{axes.staging}); drop wait_for_write or use a background staging (async, dcp with async_save: true)")
        if self.layer_checkpoint_dir is not None:
            _check_inside_checkpoint("layer_checkpoint_dir", self.layer_checkpoint_dir)

    @property
    def file_format(self) -> str:
        """What the tensor files are: ``dcp`` for the dcp layout, else ``format``."""
        return "dcp" if self.axes.layout == "dcp" else self.format

    @property
    def axis_settings(self) -> dict[str, str]:
        """The axis keys the scenario wrote itself (``layout``, ``staging``, ``schedule``)."""
        return {axis: getattr(self, axis) for axis in save_axes.AXES if getattr(self, axis) is not None}

    def recorded(self) -> dict:
        """The configuration a checkpoint's manifest records: the seed's keys as the seed wrote them (``staging`` as
        written, ``blocking`` when unset), plus ``layout`` and ``schedule`` when the scenario set them, so a preset's
        manifest is the bytes it always was. ``wait_for_write`` is left out: how the suite's pass measured, not how the
        checkpoint was written."""
        record = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init and f.name != "wait_for_write"}
        record.update(staging=self.staging or "blocking")
        for axis in ("layout", "schedule"):
            if record[axis] is None:
                del record[axis]
        return record


@dataclass(frozen=True)
class SimulateConfig:
    """``simulate: {enabled: true, ...}``: predict the step's peak on the meta device instead of running it
    (``pytest_flashckpt.simulate``; any model card, no hardware needed)."""

    enabled: bool = False
    kernel: Literal["flash", "flash_attn", "sdpa", "efficient", "cudnn", "eager"] = "flash"  # attention kernel predicted
    target: Literal["cuda", "cpu"] = "cuda"  # the device the prediction is for
    world_size: int = 1  # FSDP ranks: per-rank peak with sharded parameters, gradients, optimizer state

    def __post_init__(self) -> None:
        if self.world_size <= 0:
            raise ValueError(f"simulate.world_size must be a positive number of ranks, got {self.world_size}")


@dataclass(frozen=True)
class ModelSpec:
    """Which model card, plus the article's model-level keys."""

    card: str = "tiny"  # shipped card name or path to a card file
    type: Literal["GPT"] = "GPT"  # the article's key, ignored: the card's `family` picks the family (config/cards/)
    dropout: float | None = None  # overrides the card's dropout
    gradient_checkpointing: bool | None = None  # article key -> activation.strategy full
    checkpoint_level: Literal["layer", "model"] | None = None  # article key: 'layer' -> layer-wise save files
    layer_checkpoint_dir: str | None = None  # article key: folder for per-layer files
    # a Hugging Face causal LM instead of a card: its config's keys (model_type: gpt2, n_layer: 2, ...) or a
    # config.json path; built from the config with random weights, never downloaded (extra pytest-flashckpt[hf])
    hf: dict | str | None = None
    anatomy: dict | None = None  # hf: blocks, projections, attention, norms, embeddings, head, final_norm, tied where discovery cannot decide

    def __post_init__(self) -> None:
        if self.anatomy is not None and self.hf is None:
            raise ValueError("model.anatomy states a Hugging Face model's anatomy; it needs model.hf (the project's cards state their own)")
        if self.hf is not None:
            from pytest_flashckpt.config.hf_spec import check_hf_spec, hf_label

            check_hf_spec(self.hf, self.anatomy)
            if self.card not in ("tiny", hf_label(self.hf)):  # "tiny" is the default: the card was not named
                raise ValueError(f"model.card {self.card!r} and model.hf name two models; keep one")
            object.__setattr__(self, "card", hf_label(self.hf))  # what reports show in the card column


# pipeline stages run on the ranks of a measured scenario with these strategies (the engine's rank simulates them,
# the report sets the two side by side), eager (``distributed.rank``, docs/layouts.md)
MEASURED_PIPELINE_STRATEGIES = ("none", "full", "every_k", "selective_op")


@dataclass(frozen=True)
class Scenario:
    """One measured configuration; every ratio is against its reference (see ``reference()``)."""

    name: str
    model: ModelSpec | str = "tiny"
    suite: str = ""
    attention: Literal["auto", "flash_attn", "sdpa", "eager"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # pure: parameters, gradients and AdamW state in dtype; mixed: float32 master weights, gradients and AdamW state,
    # compute in dtype (bfloat16): torch.autocast in one process, FSDP2's MixedPrecisionPolicy under torchrun
    precision: Literal["pure", "mixed"] = "pure"
    batch_size: int = 4
    seq_len: int = 512
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    save: SaveConfig = field(default_factory=SaveConfig)  # YAML key: checkpoint (the article's word); see ALIASES
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    step_impl: StepImpl = field(default_factory=StepImpl)  # norm, optimizer, loss (config.step_impl; defaults: today's step)
    measure: tuple[MeasurePass, ...] = ("memory", "timing")
    rounds: int = 5  # interleaved timing rounds (reference, strategy, reference, strategy, ...)
    steps: int = 1  # timed training steps per round
    warmup: int = 1  # untimed steps before measuring (optimizer state exists after it)
    seed: int = 0
    world_size: int = 1  # ranks (per node) under torchrun with FSDP2 + DCP; >1 runs in pytest_flashckpt.distributed
    article: str | None = None  # id of the article claim this scenario tests (see pytest_flashckpt.core.claims)
    description: str = ""
    # how the ranks split the model (config.axes): FSDP2 over every rank by default; dp_shard x tp (tensor + sequence
    # parallel, distributed.tensor_parallel), cp (context parallel, distributed.context_parallel) and pp measured and
    # simulated (config.axes)
    layout: LayoutMesh = field(default_factory=LayoutMesh)
    compile: CompileConfig = field(default_factory=CompileConfig)

    # a suite file names the save config ``checkpoint:`` (the article's key); in code it is ``save``, because
    # "checkpoint" also means activation checkpointing (``activation``)
    ALIASES = {"checkpoint": ("save", lambda raw: {"save": raw})}

    def __post_init__(self) -> None:
        model = ModelSpec(card=self.model) if isinstance(self.model, str) else self.model
        activation, save = _fold_article_keys(model, self.activation, self.save)
        _set(self, model=model, activation=activation, save=save)
        self._check_sizes()
        self._check_precision()
        if self.step_impl != StepImpl():
            self._check_step_impl(self.activation.strategy, self.model)
        if self.world_size > 1:
            self._check_ranks()
        self._check_layout()
        self._check_measure()
        self.compile.check_scenario(self.activation.strategy, self.measure, self.world_size,
                                    self.layout.tensor_parallel)  # config.axes

    def _check_sizes(self) -> None:
        for key in ("batch_size", "seq_len", "rounds", "steps"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.world_size < 1:
            raise ValueError(f"world_size must be a positive number of ranks, got {self.world_size}")

    def _check_precision(self) -> None:
        if self.precision == "mixed" and self.dtype != "bfloat16":
            raise ValueError(
                f"precision: mixed computes in bfloat16 over float32 master weights; dtype {self.dtype} has no mixed "
                "form here: set dtype: bfloat16 (or precision: pure)"
            )
        if self.precision == "mixed" and self.activation.strategy == "budget":
            raise ValueError("precision: mixed with activation.strategy budget is not supported: the planner's costs "
                             "are measured without autocast; use a fixed strategy (full, every_k, selective_op) or precision: pure")

    def _check_ranks(self) -> None:
        """What a sharded (torchrun) scenario can be: DCP saves every save_interval, an even batch, no FLOP pass."""
        save = self.save
        if save.strategy not in ("none", "dcp") or save.axis_settings or save.axes.schedule != "every":
            extra = [*save.axis_settings, *(["mem_threshold"] if save.mem_threshold is not None else [])]
            written = f"{save.strategy!r}" + (f" with {', '.join(extra)}" if extra else "")
            raise ValueError(
                f"world_size {self.world_size}: sharded saves use checkpoint.strategy dcp (async_save: true for "
                f"dcp.async_save) every save_interval steps, not {written}; the layout, staging and schedule "
                "settings are for saves in one process"
            )
        if not self.layout.tensor_parallel and self.layout.pp == 1 and self.layout.cp == 1 and self.batch_size % self.world_size:
            raise ValueError(f"batch_size {self.batch_size} must be divisible by world_size {self.world_size} (each rank takes an equal share)")
        if "flops" in self.measure:
            raise ValueError(f"world_size {self.world_size}: 'flops' is counted in one process; drop it from measure")
        if save.wait_for_write:
            raise ValueError(f"world_size {self.world_size}: checkpoint.wait_for_write is a key of the one-process save "
                             "loop; the ranks save every save_interval steps: drop it")

    @property
    def layout_ranks(self) -> int:
        """The ranks the layout splits: ``simulate.world_size`` for a simulated scenario, else ``world_size``."""
        return self.simulate.world_size if self.simulate.enabled else self.world_size

    @property
    def parallel_layout(self) -> Layout:
        """The layout resolved over ``layout_ranks`` (``config.layout.Layout``: FSDP over every rank by default),
        what the ranks build, the engine simulates and reports name (``describe()``)."""
        dp_shard, tp = self.layout.ranks(self.layout_ranks)
        return Layout(dp_shard=dp_shard, tp=tp, pp=self.layout.pp, cp=self.layout.cp,
                      dp_replicate=self.layout.dp_replicate)

    def _check_layout(self) -> None:
        """A layout other than FSDP over every rank: ranks that multiply to the world (``layout_ranks``), an even
        share of the batch per data-parallel rank, a model the tensor-parallel plan reads (a card: the plan comes
        from its family's anatomy). The card's heads and family are checked by ``config.preflight`` and the
        suite's load (``runner.suite.check_layouts``: the plan built on meta)."""
        world = self.layout_ranks
        if (self.layout.tp == 1 and self.layout.pp == 1 and self.layout.cp == 1 and self.layout.dp_replicate == 1
                and self.layout.dp_shard in (None, world)):
            _set(self, layout=LayoutMesh())  # FSDP over every rank written out is today's layout (and fingerprint)
            return
        key = "simulate.world_size" if self.simulate.enabled else "world_size"
        if self.layout.pp > 1 and not self.simulate.enabled:
            self._check_measured_stages()
        if world == 1:
            axes = (f"{self.layout.pp} pipeline stages" if self.layout.pp > 1 else f"{self.layout.cp} context-parallel "
                    "ranks" if self.layout.cp > 1 else f"{self.layout.tp} tensor-parallel ranks")
            ranks = self.layout.tp * self.layout.pp * self.layout.cp * self.layout.dp_replicate * (self.layout.dp_shard or 1)
            raise ValueError(f"layout ({axes}) needs ranks: set {key} to dp_shard x tp x pp x cp (e.g. {key}: {ranks})")
        dp_shard, _ = self.layout.ranks(world)
        dp_shard *= self.layout.dp_replicate  # the data-parallel ranks: HSDP replicas read their own rows too
        if self.layout.cp > 1:
            self._check_context()
        if self.layout.pp > 1:  # (the stages against the card's blocks: simulate.layouts, where the card is loaded)
            self.layout.pipeline_schedule().check_batch(self.parallel_layout, batch_size=self.batch_size)
        if self.batch_size % dp_shard:
            ranks = "layout.dp_replicate x dp_shard" if self.layout.dp_replicate > 1 else "layout.dp_shard"
            raise ValueError(f"batch_size {self.batch_size} must be divisible by {ranks} {dp_shard} (each "
                             "data-parallel rank takes an equal share; tensor-parallel ranks share their group's rows)")
        if self.model.hf is not None:  # type: ignore[union-attr]
            raise ValueError("a layout (tp, pp, cp) with model.hf is not built: the tensor-parallel plan is read from a model card's "
                             "family anatomy (distributed.tensor_parallel); use a card (e.g. llama-tiny) or drop layout")

    def _check_context(self) -> None:
        """Context parallel: a sequence the load-balanced ring splits (``2 x cp`` chunks), attention by the flash op
        the ring runs (``distributed.context_parallel``: SDPA's, ``auto`` or ``sdpa``)."""
        try:
            self.parallel_layout.check_sequence(self.seq_len)
        except ValueError as exc:
            raise ValueError(f"seq_len {self.seq_len}: {exc}") from None
        if self.attention not in ("auto", "sdpa"):
            raise ValueError(f"attention {self.attention} with layout.cp {self.layout.cp}: torch's ring attention runs "
                             "the flash op (SDPA's); set attention: sdpa (or auto), or drop layout.cp")

    def _check_measured_stages(self) -> None:
        """Pipeline stages on the ranks of a measured scenario: a strategy the stages run with (saves: dcp, as every
        sharded scenario, ``_check_ranks``); compiled per block as reports/spike-compiled-stages.md and, with tensor
        parallel inside the stages, reports/spike-compiled-tp-stages.md, with context parallel inside,
        reports/spike-compiled-cp-stages.md measured them (what compiles under tensor parallel:
        ``CompileConfig.check_scenario``)."""
        if self.activation.strategy not in MEASURED_PIPELINE_STRATEGIES:
            raise NotBuiltYet(f"layout.pp {self.layout.pp} with activation.strategy {self.activation.strategy}: pipeline stages run "
                              f"{', '.join(MEASURED_PIPELINE_STRATEGIES)} on measured ranks; pick one of them")

    def _check_measure(self) -> None:
        """The passes agree with the save: a save strategy adds the checkpoint pass, a checkpoint pass needs one."""
        if self.save.mem_basis == "peak" and "memory" not in self.measure:
            raise ValueError("checkpoint.mem_basis: peak compares memory with the measured peak; add 'memory' to measure")
        if "checkpoint" in self.measure and self.save.strategy == "none":
            raise ValueError("measure includes 'checkpoint' but checkpoint.strategy is 'none'; name a save strategy")
        if self.save.strategy != "none" and "checkpoint" not in self.measure:
            _set(self, measure=(*self.measure, "checkpoint"))

    def to_plain(self) -> dict:
        """The scenario as plain JSON-able data (``results.json``'s ``config``), what ``typed.build`` takes back."""
        return to_plain(self)

    def _check_step_impl(self, strategy: str, model: ModelSpec) -> None:
        """A non-default ``step_impl`` where only the default step runs: a ValueError naming the setting."""
        where = ("model.hf" if model.hf is not None else f"world_size {self.world_size}" if self.world_size > 1
                 else "activation.strategy budget" if strategy == "budget" and self.step_impl.with_card_norm() != StepImpl()
                 else None)
        if where is not None:
            raise ValueError(f"step_impl ({self.step_impl.describe()}) with {where} is not supported (that step runs "
                             "the card's norm, AdamW and the plain loss); drop step_impl or use a model card in one process")

    @property
    def card(self) -> str:
        return self.model.card  # type: ignore[union-attr]

    @property
    def precision_label(self) -> str:
        """How a report names the precision: the dtype (pure) or ``mixed bf16/fp32`` (compute / master state)."""
        return precision_label(self.dtype, self.precision)

    @property
    def is_reference(self) -> bool:
        return self.activation.strategy == "none"

    def reference(self) -> "Scenario":
        """The same model, kernel, batch and sequence with no activation checkpointing and a plain sync save.

        The model's article keys (``gradient_checkpointing``, ``checkpoint_level``, ``layer_checkpoint_dir``) are
        cleared too: ``dataclasses.replace`` runs ``__post_init__`` again, which would fold them back into the
        activation and save strategies and make the reference checkpoint itself.

        The reference save makes at most ``REFERENCE_SAVES`` saves, keeps as many as the scenario keeps, and measures
        the time lost per save only when the scenario does: what it feeds (``bytes_vs_full``, ``stall_vs_sync``,
        ``time_lost_vs_sync``) is not gated, and the scenarios of one workload then share one reference save pass
        (``RunContext.cached``)."""
        plain = "dcp" if self.world_size > 1 else "sync"  # sharded state: the plain synchronous save is DCP's
        save = (
            SaveConfig(strategy=plain, format=self.save.format, saves=min(self.save.saves, REFERENCE_SAVES),
                       time_lost_rounds=self.save.time_lost_rounds, max_keep=self.save.max_keep)
            if self.save.strategy != "none" else SaveConfig()
        )
        model = dataclasses.replace(self.model, gradient_checkpointing=None, checkpoint_level=None, layer_checkpoint_dir=None)  # type: ignore[arg-type]
        return dataclasses.replace(
            self, name=f"{self.name}.reference", model=model, activation=ActivationConfig(), save=save, article=None
        )


SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def precision_label(dtype: str, precision: str = "pure") -> str:
    """``fp32`` / ``bf16`` / ``fp16`` in pure precision; ``mixed bf16/fp32`` (compute / master state) in mixed."""
    short = SHORT_DTYPES.get(dtype, dtype)
    return f"mixed {short}/fp32" if precision == "mixed" else short


def _fold_article_keys(model: ModelSpec, activation: ActivationConfig, save: SaveConfig) -> tuple[ActivationConfig, SaveConfig]:
    """The article's model-level keys folded into the typed strategies: ``gradient_checkpointing`` -> activation
    ``full`` / ``none``; ``checkpoint_level: layer`` (or ``layer_checkpoint_dir``) -> the ``layerwise`` save.
    ValueError when a key contradicts the strategy the scenario names."""
    if model.gradient_checkpointing is not None:
        wanted = "full" if model.gradient_checkpointing else "none"
        if activation.strategy not in ("none", wanted):
            raise ValueError(
                f"model.gradient_checkpointing: {model.gradient_checkpointing} contradicts activation.strategy "
                f"{activation.strategy!r}; keep one of them"
            )
        activation = dataclasses.replace(activation, strategy=wanted)
    if model.checkpoint_level == "layer" or model.layer_checkpoint_dir is not None:
        if save.strategy not in ("none", "sync", "layerwise"):
            raise ValueError(
                f"model.checkpoint_level: layer asks for layer-wise save files, but checkpoint.strategy is "
                f"{save.strategy!r}; keep one of them"
            )
        save = dataclasses.replace(save, strategy="layerwise", layer_checkpoint_dir=model.layer_checkpoint_dir or save.layer_checkpoint_dir)
    return activation, save


def _flag(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value
