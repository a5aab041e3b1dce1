"""A memory-budget plan that ``torch.compile`` consumes: per block, which op outputs to save (``MUST_SAVE``) and
which to recompute (``PREFER_RECOMPUTE``), handed to a per-block compiled ``checkpoint`` as torch documents
(``torch.compile(block)`` around ``checkpoint(block.forward, context_fn=partial(create_selective_checkpoint_contexts,
policy))``), rather than whole-block options that race compile's own partitioner.

How a plan is made (``plan_compiled``):

1. **Ops, on fake tensors.** One forward of the model under ``FakeTensorMode`` (CPU device, so the CPU kernels'
   ops are the ones recorded; nothing is allocated) records every aten op each block runs: the bytes of the
   storages it creates, its matmul FLOPs (``torch.utils.flop_counter``'s formulas, the CPU flash kernel's from
   ``activation.flops``), its pointwise output elements, which earlier ops of the block made its inputs, and
   whether autograd saves its output for the backward (a ``saved_tensors_hooks`` pack hook). An op is a
   *candidate* to save when autograd saves its output and it is neither a view (no storage of its own), nor
   in-place, nor random (never saved, so a replay draws what the forward drew, as ``activation.policy``).
2. **Save sets, exactly.** For a save set ``S`` the backward must rebuild every saved-for-backward output not in
   ``S``, and with it every op on the way from the block's inputs or ``S`` (the closure over the recorded data
   flow: compile's partitioner recomputes only what the backward reads). Its cost is the FLOPs of those ops plus
   their pointwise elements at the project's fixed weight (``costs.pointwise_weight_for``); its bytes are the
   outputs of ``S``. Every subset of the candidates is scored (at most ``MAX_EXACT_CANDIDATES``: 2^n subsets; past
   that a greedy order, stated in ``BlockMenu.exact``) and the Pareto front of (bytes, cost) is the block's menu.
3. **Blocks, against the step's peak.** Each menu entry is a block option whose kept bytes and reach are the
   ``full`` option's (the step's segments, measured or simulated by a ``CostSource``: ``model.PlanCosts``) plus the
   entry's bytes; ``none`` (no checkpoint: the partitioner's own min-cut) keeps eager's no-checkpointing bytes.
   The eager planner's exact solver (``solver.solve``, via ``BudgetPlanner``) then picks one entry per block: the
   least recomputation whose predicted whole-step peak fits the budget (a size, a fraction, ``"min + N%"``). The
   prediction does not subtract what a saved output spares the recomputation, and it holds compiled as long as
   the partitioner saves no more than eager autograd would for ``none`` and ``S`` plus the block's inputs for a
   policy, and Inductor's backward of a block holds no more at once than eager's: measured, not assumed. It held
   at every point of ``reports/compile-plan-sweep.md`` (tiny, llama-tiny at 4 x 256, within 0.02 MiB); on a
   width-32 GPT, where activations do not dominate, the compiled step went 13% over it: each block whose
   policy saves ``gelu``'s output held one batch x seq x 4C tensor more compiled than the plan counts (by the
   bytes, ``c_fc``'s output, which gelu's backward reads; ``reports/compiled-plan-check.md``). Compile's ``none`` keeps less
   than eager's (llama-tiny: 82.4 vs 93.0 MiB), which this prices at eager's bytes (point 5 prices it compiled).
4. **The compiled check** (optional, ``compiled_peak``): the plan's step simulated compiled
   (``simulate.compiled.compiled_peak_check``: the partitioner's saved set and Inductor's memory plan on fake
   tensors, byte-equal to the allocator on that GPT) and, while over the budget, solved again within the budget
   less the prediction's error, stepping down the Pareto front a bounded number of times (``MAX_REPLANS``);
   ``CompilePlan.compiled_checks`` records each simulated plan and ``describe()`` the re-plans it took.
5. **Against the fixed strategies** (with the compiled check): the registry's compiled-simulated strategies that
   are one save set per block (``FIXED_CANDIDATES``: ``none``, ``full``, ``every_k``, ``selective_op``, as
   per-block policies, ``fixed_policies``) are priced by the same cost model (recomputation) and the same compiled
   check (peak), cheapest recomputation first, only while they recompute less than the solved plan (every one when
   the solved plan does not hold compiled); the first that fits the budget compiled is the plan
   (``CompilePlan.fixed``, ``fixed_checks``, ``fixed_note()``). On llama-tiny at 4 x 256, ``min + 75%``: ``none``
   (82.38 MiB compiled, 0 recomputed) in place of save sets the eager segments priced as fitting.

Where this differs from torch's own tools, and why:

- ``torch._functorch.config.activation_memory_budget`` (partitioners.``choose_saved_values_set``) is a fraction
  of one compiled graph's activation estimate, between saving only its inputs (0) and the min-cut's saved set (1),
  solved as a knapsack over the nodes the min-cut had banned from recomputation, each priced by
  ``activation_memory_budget_runtime_estimator`` (``"flops"``: ``FlopCounterMode`` FLOPs, at least 1, so a
  pointwise op is free to recompute), then the min-cut again with the chosen nodes allowed. Under per-block
  compile the fraction is per block graph and says nothing about the step's peak (weights, gradients, optimizer
  state, the head's logits). Here the budget is bytes of the whole step's peak, and a recomputed pointwise op is
  priced by memory traffic (on a CPU an element costs what 128 float32 FLOPs do), not at one FLOP.
- ``torch.distributed._tools.sac_estimator.SACEstimator`` records per-op memory and runtime the same way (a
  dispatch mode under ``FakeTensorMode``), but counts every op's output as memory a save keeps and prices a
  recomputation additively per op, in a greedy order of memory saved per second (roofline or benchmarked
  runtimes, CUDA-oriented). Here only outputs autograd saves are candidates (an op whose output the backward
  never reads frees nothing when recomputed) and a save set's cost is the closure of what must be rebuilt, so
  saving an output also spares the ops beneath it.
- ``torch.distributed._tools.sac_ilp`` solves per module with a MILP (``pulp``, not a dependency here) whose
  memory budget is a fraction of that module's op memory, and across modules a MILP over discard ratios read off a
  piecewise-linear fit of the greedy trade-off curve. Here the per-block menu is exact enumeration and the
  across-block choice the same exact Pareto walk as the eager ``budget`` strategy: no solver dependency, no fit,
  and the same costs give the same plan on every run.

Blocks under different policies compile to different graphs (Dynamo guards the policy, a constant): a plan
with ``k`` distinct entries compiles ``k`` block graphs (``CompilePlan.distinct_policies``). Plans are per
(batch, seq); a shape the plan was not made for needs its own plan.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import flop_registry, shape_wrapper

from pytest_flashckpt.activation.budget.costs import pointwise_weight_for
from pytest_flashckpt.activation.budget.model import CostSource, PlanCosts
from pytest_flashckpt.activation.budget.planner import BudgetPlanner, ShapePlan
from pytest_flashckpt.activation.budget.solver import solve
from pytest_flashckpt.activation.flops import CPU_FLASH_FORMULAS
from pytest_flashckpt.activation.ops import DEFAULT_SAVE_OPS
from pytest_flashckpt.activation.options import FULL, NONE
from pytest_flashckpt.config.budget import BudgetSpec
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.models.anatomy import get_blocks

MAX_EXACT_CANDIDATES = 16  # 2^16 save sets scored per distinct block: well under a second; beyond, a greedy order
_FLOP_FORMULAS = {**flop_registry, **{op: shape_wrapper(f) for op, f in CPU_FLASH_FORMULAS.items()}}
MAX_REPLANS = 4  # re-plans after a compiled check over budget (each one simulates the compiled step once more)
# the fixed strategies a compiled plan is priced against (``plan_compiled``): the registry's strategies with a
# ``simulated_compiled`` kind whose plan is one save set per block (``fixed_policies``); the others, and why not
FIXED_CANDIDATES = ("none", "full", "every_k", "selective_op")
NOT_FIXED_CANDIDATES = {
    "compile_budget": "compile's knob: a fraction of the partitioner's estimate, not a save set (the sweep's alternative)",
    "budget": "the compiled plan itself",
}
EVERY_K = ActivationConfig.k  # every_k's default k: checkpoint blocks 0, k, 2k, ...
RANDOM = "draws random numbers (never saved: a replay draws what the forward drew)"
StepFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
# the whole-step peak bytes of the step compiled per block under the given per-block policies (None: no checkpoint):
# ``simulate.compiled.compiled_peak_check`` (the compiled-step simulator, a layer above this one, passes itself in)
CompiledPeak = Callable[[tuple], int]


# ---- 1. the ops of each block, recorded on fake tensors ---------------------------------------------------------

@dataclass(frozen=True)
class OpRecord:
    """One storage-making aten op of a block's forward. ``key`` is how a policy finds it again: the overload's
    name and its occurrence among that overload's calls in the block (``("aten.addmm.default", 2)``: the third
    ``addmm``), which is what the selective-checkpoint policy can count, compiled or eager."""

    key: tuple[str, int]
    bytes: int  # bytes of the storages it creates (all its outputs)
    flops: int  # matmul FLOPs (PyTorch's formulas)
    pointwise: int  # output elements of a pointwise op (0 otherwise)
    parents: tuple[int, ...]  # indices (in BlockOps.ops) of the block's ops that made its inputs
    saved_for_backward: bool  # autograd keeps (a view of) one of its outputs for the backward
    why_not: str = ""  # why it is not a candidate to save ("" if it is one)

    @property
    def candidate(self) -> bool:
        return self.saved_for_backward and not self.why_not

    @property
    def label(self) -> str:
        name, occurrence = self.key
        return f"{name.removeprefix('aten.').removesuffix('.default')}#{occurrence}"


@dataclass(frozen=True)
class BlockOps:
    """The storage-making ops of one block's forward, in order (views are folded into the op that made the storage)."""

    ops: tuple[OpRecord, ...]

    @property
    def candidates(self) -> tuple[int, ...]:
        return tuple(i for i, op in enumerate(self.ops) if op.candidate)

    def signature(self) -> tuple:
        """Equal for blocks whose ops are the same (scored once)."""
        return tuple((op.key, op.bytes, op.flops, op.pointwise, op.parents, op.saved_for_backward, op.why_not) for op in self.ops)


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _draws_random_numbers(func, args, kwargs) -> bool:
    """Tagged ``nondeterministic_seeded``, except an attention kernel with ``dropout_p`` 0 (as ``SACEstimator``
    reads it: the tag is the overload's, dropout is the call's)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == "dropout_p":
            value = (kwargs or {}).get("dropout_p", args[position] if position < len(args) else argument.default_value)
            return value != 0
    return True


class _OpRecorder(TorchDispatchMode):
    """Records the ops of the block that is running (``block`` set by the blocks' hooks; None between blocks)."""

    def __init__(self, n_blocks: int) -> None:
        super().__init__()
        self.block: int | None = None
        self.ops: list[list[dict]] = [[] for _ in range(n_blocks)]
        self.producer: list[dict[int, int]] = [{} for _ in range(n_blocks)]  # storage -> op index, per block
        self.saved: list[set[int]] = [set() for _ in range(n_blocks)]  # storages autograd saved, per block
        self.counts: list[Counter] = [Counter() for _ in range(n_blocks)]
        self._alive: list = []  # keeps recorded storages alive, so their keys are never reused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.block is None:
            return out
        i = self.block
        name = str(func)
        occurrence = self.counts[i][name]
        self.counts[i][name] += 1
        flat_in = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        flat_out = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        known = self.producer[i]
        new = {}
        for t in flat_out:
            key = _storage_key(t)
            if key not in known and key not in new and key not in {_storage_key(a) for a in flat_in}:
                new[key] = t.untyped_storage().nbytes()
                self._alive.append(t)
        if not new:  # a view or an in-place op: it makes no storage, its outputs belong to the op that made them
            if func._schema.is_mutable:
                # an in-place op changes a storage: the op that made it cannot be saved alone (and a random fill,
                # dropout's bernoulli_, makes it random)
                why = RANDOM if _draws_random_numbers(func, args, kwargs) else f"written in place by {name}"
                for t in flat_out:
                    made_by = known.get(_storage_key(t))
                    if made_by is not None and self.ops[i][made_by]["why_not"] != RANDOM:
                        self.ops[i][made_by]["why_not"] = why
            return out
        formula = _FLOP_FORMULAS.get(func.overloadpacket)
        why_not = ""
        if _draws_random_numbers(func, args, kwargs):
            why_not = RANDOM
        first = flat_out[0] if flat_out else None
        record = {
            "key": (name, occurrence),
            "bytes": sum(new.values()),
            "flops": formula(*args, **(kwargs or {}), out_val=out) if formula is not None else 0,
            "pointwise": first.numel() if torch.Tag.pointwise in func.tags and first is not None else 0,
            "parents": tuple(sorted({known[_storage_key(a)] for a in flat_in if _storage_key(a) in known})),
            "why_not": why_not,
        }
        index = len(self.ops[i])
        self.ops[i].append(record)
        for key in new:
            known[key] = index
        return out

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.block is not None:
            self.saved[self.block].add(_storage_key(tensor))
        return tensor

    def block_ops(self, i: int) -> BlockOps:
        saved_ops = {self.producer[i][key] for key in self.saved[i] if key in self.producer[i]}
        return BlockOps(tuple(OpRecord(saved_for_backward=j in saved_ops, **record) for j, record in enumerate(self.ops[i])))


def _default_step(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model(tokens, targets)


def record_block_ops(
    model: nn.Module, batch_size: int, seq_len: int, blocks: Iterable[nn.Module] | None = None, step: StepFn | None = None,
) -> list[BlockOps]:
    """Each block's ops at (batch, seq), from one forward of ``model`` on fake tensors (its parameters and buffers
    read as fakes of themselves: the model is not touched). ``step(model, tokens, targets) -> loss`` says how the
    model is called (default ``model(tokens, targets)``, the project's models)."""
    blocks = list(blocks if blocks is not None else get_blocks(model))
    recorder = _OpRecorder(len(blocks))
    hooks = torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t)
    handles = []
    for i, block in enumerate(blocks):

        def enter(_module, _args, i=i) -> None:
            recorder.block = i

        def leave(_module, _args, _output) -> None:
            recorder.block = None

        handles += [block.register_forward_pre_hook(enter), block.register_forward_hook(leave)]
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as fake:
            state = {name: fake.from_tensor(t) for name, t in itertools.chain(model.named_parameters(), model.named_buffers())}
            for name, p in model.named_parameters():
                state[name].requires_grad_(p.requires_grad)
            tokens = torch.zeros((batch_size, seq_len), dtype=torch.long)
            with recorder, hooks, torch.enable_grad():
                (step or _default_step)(_Stateless(model, state), tokens, tokens)
    finally:
        for handle in handles:
            handle.remove()
    return [recorder.block_ops(i) for i in range(len(blocks))]


class _Stateless(nn.Module):
    """``model`` called with ``state`` in place of its parameters and buffers (``torch.func.functional_call``), so a
    step that calls ``model(tokens, targets)`` runs it on fake tensors."""

    def __init__(self, model: nn.Module, state: dict) -> None:
        super().__init__()
        self.__dict__["wrapped"], self.__dict__["state"] = model, state

    def forward(self, *args, **kwargs):
        return torch.func.functional_call(self.wrapped, self.state, args, kwargs)


# ---- 2. one block's save sets: the Pareto front of (bytes kept, recomputation) ----------------------------------

@dataclass(frozen=True)
class SavePolicy:
    """The ops a checkpointed block saves (``MUST_SAVE``), by ``OpRecord.key``; every other op is recomputed
    (``PREFER_RECOMPUTE``). Hashable and constant, so Dynamo guards it as a constant (one graph per policy)."""

    saved: frozenset[tuple[str, int]]

    @property
    def name(self) -> str:
        """``full`` when nothing is saved; ``save_ops(addmm#0+gelu#0)`` otherwise (how plans and reports show it)."""
        if not self.saved:
            return "full"
        labels = sorted(f"{n.removeprefix('aten.').removesuffix('.default')}#{k}" for n, k in self.saved)
        return "save_ops(" + "+".join(labels) + ")"


@dataclass(frozen=True)
class MenuEntry:
    """One save set on a block's Pareto front: the policy, the bytes it keeps, what the backward recomputes."""

    policy: SavePolicy
    bytes: int
    flops: int
    pointwise: int
    cost: float  # flops + pointwise x the pointwise weight

    @property
    def name(self) -> str:
        return self.policy.name


@dataclass(frozen=True)
class BlockMenu:
    entries: tuple[MenuEntry, ...]  # by bytes, ascending; the first saves nothing (full)
    exact: bool  # every subset of the candidates was scored (False: the greedy order, past MAX_EXACT_CANDIDATES)


def _rebuilt(ops: tuple[OpRecord, ...], saved: set[int]) -> list[int]:
    """Indices of the ops the backward recomputes when ``saved`` is kept: every saved-for-backward op not kept,
    and each op on the way to it from the block's inputs or a kept op."""
    need = {j for j, op in enumerate(ops) if op.saved_for_backward and j not in saved}
    for j in range(len(ops) - 1, -1, -1):  # parents come earlier: one backward walk closes the set
        if j in need:
            need.update(p for p in ops[j].parents if p not in saved)
    return sorted(need)


def _entry(block: BlockOps, saved: Iterable[int], pointwise_weight: float) -> MenuEntry:
    saved = set(saved)
    rebuilt = _rebuilt(block.ops, saved)
    flops = sum(block.ops[j].flops for j in rebuilt)
    pointwise = sum(block.ops[j].pointwise for j in rebuilt)
    return MenuEntry(SavePolicy(frozenset(block.ops[j].key for j in saved)), sum(block.ops[j].bytes for j in saved),
                     flops, pointwise, flops + pointwise_weight * pointwise)


def block_menu(block: BlockOps, pointwise_weight: float) -> BlockMenu:
    """The Pareto front of (bytes kept, recompute cost) over save sets of the block's candidates; ties keep the
    set with the fewest ops, then the earliest ones, so the same ops give the same menu on every run."""
    candidates = block.candidates
    exact = len(candidates) <= MAX_EXACT_CANDIDATES
    if exact:
        subsets = (c for r in range(len(candidates) + 1) for c in itertools.combinations(candidates, r))
    else:  # greedy: add candidates in order of recompute cost spared per byte kept, one prefix per menu entry
        empty = _entry(block, (), pointwise_weight)
        spared = {j: empty.cost - _entry(block, (j,), pointwise_weight).cost for j in candidates}
        order = sorted(candidates, key=lambda j: (-spared[j] / max(block.ops[j].bytes, 1), j))
        subsets = (tuple(order[:r]) for r in range(len(order) + 1))
    scored = sorted((_entry(block, s, pointwise_weight) for s in subsets), key=lambda e: (e.bytes, e.cost, len(e.policy.saved)))
    front, best = [], float("inf")
    for entry in scored:
        if entry.cost < best:
            front.append(entry)
            best = entry.cost
    return BlockMenu(tuple(front), exact)


# ---- 3. the plan: one menu entry (or none) per block, against the step's peak -----------------------------------

class PolicyCosts:
    """``CostSource`` whose options are ``none`` and each block's menu entries, so the eager planner's solver and
    ``BudgetPlanner`` (budget parsing, the minimum, the refusal message) plan compiled blocks. ``source`` supplies
    the step's segments with ``none`` and ``full`` (``SimulatedCosts(..., options=(NONE, FULL))`` or
    ``MeasuredCosts``); an entry keeps ``full``'s bytes plus its own, and reaches ``full``'s reach plus its own."""

    def __init__(self, model: nn.Module, source: CostSource, blocks=None, step: StepFn | None = None,
                 pointwise_weight: float | None = None) -> None:
        self.model, self.source, self.blocks, self.step = model, source, blocks, step
        param = next(model.parameters())
        self.pointwise_weight = pointwise_weight if pointwise_weight is not None else pointwise_weight_for(param.device.type, param.dtype)
        self.menus: dict[tuple[int, int], list[BlockMenu]] = {}
        self.ops: dict[tuple[int, int], list[BlockOps]] = {}

    def costs(self, batch_size: int, seq_len: int) -> PlanCosts:
        base = self.source.costs(batch_size, seq_len)
        missing = [o.name for o in (NONE, FULL) if o not in base.options]
        if missing:
            raise ValueError(f"compile plan: the cost source has no {' / '.join(missing)} option; pass one that measures "
                             "none and full (SimulatedCosts(..., options=(NONE, FULL)) or MeasuredCosts)")
        menus = self.menu(batch_size, seq_len)
        if len(menus) != base.n_blocks:
            raise ValueError(f"compile plan: the cost source has {base.n_blocks} blocks, the model {len(menus)}")
        width = max(len(m.entries) for m in menus)
        none, full = base.option_index(NONE), base.option_index(FULL)
        # a block with a shorter menu repeats its last entry (more bytes, never chosen over an equal cheaper one)
        entries = [[m.entries[min(k, len(m.entries) - 1)] for k in range(width)] for m in menus]
        options = (NONE, *(_MenuOption(k) for k in range(width)))
        return PlanCosts(
            batch_size, seq_len, options,
            kept=[[base.kept[i][none]] + [base.kept[i][full] + e.bytes for e in entries[i]] for i in range(base.n_blocks)],
            reach=[[base.reach[i][none]] + [base.reach[i][full] + e.bytes for e in entries[i]] for i in range(base.n_blocks)],
            flops=[[0] + [e.flops for e in entries[i]] for i in range(base.n_blocks)],
            pointwise=[[0] + [e.pointwise for e in entries[i]] for i in range(base.n_blocks)],
            before=base.before, pointwise_weight=self.pointwise_weight, source=base.source, seconds=base.seconds,
            notes=base.notes,
        )

    def menu(self, batch_size: int, seq_len: int) -> list[BlockMenu]:
        key = (batch_size, seq_len)
        if key not in self.menus:
            scored: dict[tuple, BlockMenu] = {}
            menus = []
            self.ops[key] = record_block_ops(self.model, batch_size, seq_len, self.blocks, self.step)
            for ops in self.ops[key]:
                signature = ops.signature()
                if signature not in scored:
                    scored[signature] = block_menu(ops, self.pointwise_weight)
                menus.append(scored[signature])
            self.menus[key] = menus
        return self.menus[key]


@dataclass(frozen=True)
class _MenuOption:
    """Menu entry ``index`` of every block, as an option of ``PlanCosts`` (its name is the block's own entry's,
    read through ``CompilePlan``)."""

    index: int

    @property
    def name(self) -> str:
        return f"menu#{self.index}"


@dataclass(frozen=True)
class CompilePlan:
    """Per block: the ``SavePolicy`` its compiled checkpoint runs, or None (no checkpoint: compile's partitioner
    alone); the shape's ``ShapePlan`` (budget, predicted peak, minimum, no-checkpointing peak) and whether every
    menu was exact."""

    policies: tuple[SavePolicy | None, ...]
    shape_plan: ShapePlan
    exact_menus: bool
    # the compiled check (``plan_compiled(..., compiled_peak=...)``), one row per plan it simulated, in order; the
    # last row is this plan's. Empty: not checked (the plan is the eager-segment prediction alone)
    compiled_checks: tuple[CompiledCheck, ...] = ()
    # the fixed strategies priced against the solved plan (compiled-checked plans only), in the order priced
    fixed_checks: tuple[FixedCheck, ...] = ()
    # the fixed strategy (``FIXED_CANDIDATES``) this plan is: one that fits the budget compiled and recomputes less
    # than the solved plan (``policies`` are then its, priced by its ``fixed_checks`` row), or the solved plan's
    # policies when they are a fixed strategy's; None: the solved plan's save sets
    fixed: str | None = None

    @property
    def _fixed_check(self) -> FixedCheck | None:
        return next((c for c in self.fixed_checks if c.name == self.fixed), None)

    @property
    def compiled_peak(self) -> int | None:
        """The compiled step's whole-step peak the check simulated for this plan (None: not checked)."""
        chosen = self._fixed_check
        if chosen is not None:
            return chosen.simulated_peak
        return self.compiled_checks[-1].simulated_peak if self.compiled_checks else None

    @property
    def predicted_peak(self) -> int:
        """The eager-segment prediction of the plan kept (a fixed strategy's, when the plan is one it priced)."""
        chosen = self._fixed_check
        return self.shape_plan.plan.predicted_peak if chosen is None else chosen.predicted_peak

    @property
    def flops(self) -> int:
        """Matmul FLOPs the plan kept recomputes (the cost model's)."""
        chosen = self._fixed_check
        return self.shape_plan.plan.flops if chosen is None else chosen.flops

    @property
    def cost(self) -> float:
        """The plan kept's recomputation in the solver's unit: FLOPs plus pointwise elements at their weight."""
        chosen = self._fixed_check
        return self.shape_plan.plan.cost if chosen is None else chosen.cost

    @property
    def replans(self) -> int:
        return max(len(self.compiled_checks) - 1, 0)

    @property
    def holds_compiled(self) -> bool | None:
        """Whether the simulated compiled peak is within the budget (None: not checked)."""
        peak = self.compiled_peak
        return None if peak is None else peak <= self.shape_plan.budget_bytes

    def compiled_note(self) -> str:
        """What the compiled check predicted and how many re-plans it took ("" when not checked)."""
        if not self.compiled_checks:
            return ""
        tried = "; ".join(f"{', '.join(c.names)}: predicted {c.predicted_peak:,} B, compiled {c.simulated_peak:,} B"
                          f"{'' if c.solve_budget == self.shape_plan.budget_bytes else f' (solved within {c.solve_budget:,} B)'}"
                          for c in self.compiled_checks)
        last = self.compiled_checks[-1].simulated_peak  # the solved plan's (a fixed strategy's is in fixed_note)
        verdict = ("holds" if last <= self.shape_plan.budget_bytes else
                   f"does NOT hold: {last - self.shape_plan.budget_bytes:+,} B over, no plan on the front fits compiled")
        return (f"compiled check (simulate_compiled_step) {verdict} the budget {self.shape_plan.budget_bytes:,} B after "
                f"{self.replans} re-plan(s) [{tried}]")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple("none" if p is None else p.name for p in self.policies)

    @property
    def distinct_policies(self) -> int:
        return len(set(self.policies))

    def describe(self) -> str:
        s = self.shape_plan
        return (f"b{s.batch_size}xs{s.seq_len}: {'; '.join(f'block {i} {n}' for i, n in enumerate(self.names))} "
                f"(predicted peak {self.predicted_peak / 2**20:,.1f} MiB of budget {s.budget_bytes / 2**20:,.1f} MiB; "
                f"min {s.min_peak / 2**20:,.1f}, none {s.none_peak / 2**20:,.1f} MiB; +{self.flops / 1e9:.3f} GFLOP recomputed)"
                + (f"; {self.compiled_note()}" if self.compiled_checks else "")
                + (f"; {self.fixed_note()}" if self.compiled_checks else ""))

    def fixed_note(self) -> str:
        """Which fixed strategies were priced compiled against the solved plan, and which plan was kept ("" when
        not checked compiled)."""
        if not self.compiled_checks:
            return ""
        solved = self.shape_plan.plan
        priced = "; ".join(f"{c.name}: recomputes {c.cost / 1e9:.3f} GFLOP-eq, compiled {c.simulated_peak:,} B "
                           f"({'fits' if c.simulated_peak <= self.shape_plan.budget_bytes else 'over'})"
                           for c in self.fixed_checks)
        head = (f"fixed strategies priced compiled [{priced}]" if self.fixed_checks else
                "no fixed strategy priced (not one recomputes less than the solved plan, or the solved plan is one)")
        if self.fixed is not None and self._fixed_check is not None:
            return (f"{head}: the plan is fixed `{self.fixed}` (fits compiled, recomputes {self.cost / 1e9:.3f} GFLOP-eq "
                    f"against the solved plan's {solved.cost / 1e9:.3f})")
        if self.fixed is not None:
            return f"{head}: the solved plan is fixed `{self.fixed}`"
        return f"{head}: the solved plan is kept"


@dataclass(frozen=True)
class CompiledCheck:
    """One plan the compiled check simulated: its per-block names, the budget it was solved within (the user's, or
    one tightened after an overshoot), its eager-segment prediction and the simulated compiled peak."""

    names: tuple[str, ...]
    solve_budget: int
    predicted_peak: int
    simulated_peak: int


@dataclass(frozen=True)
class FixedCheck:
    """One fixed strategy priced against the solved plan: its recomputation by the cost model (matmul FLOPs, and
    the solver's cost: FLOPs plus pointwise elements at their weight), its eager-segment prediction and its
    compiled step simulated (the plan's ``compiled_peak``)."""

    name: str
    flops: int
    cost: float
    predicted_peak: int
    simulated_peak: int


def selective_op_policy(block: BlockOps, save_ops: Iterable[str] = DEFAULT_SAVE_OPS) -> SavePolicy:
    """``selective_op``'s default as a save set: each candidate (an output the backward reads) whose overload is
    in its default list (the matmuls and the attention kernel; an output projection's is no candidate: the backward
    never reads it, which is why ``selective_op`` recomputes it)."""
    names = set(save_ops)
    return SavePolicy(frozenset(op.key for op in block.ops if op.candidate and op.key[0] in names))


def fixed_policies(name: str, blocks: list[BlockOps], k: int = EVERY_K) -> tuple[SavePolicy | None, ...]:
    """A fixed strategy of ``FIXED_CANDIDATES`` as per-block policies: ``none`` no checkpoint, ``full`` a
    checkpoint saving nothing, ``every_k`` ``full`` on blocks 0, k, 2k, ..., ``selective_op`` its default save set
    (``selective_op_policy``)."""
    if name == "none":
        return (None,) * len(blocks)
    if name == "full":
        return (SavePolicy(frozenset()),) * len(blocks)
    if name == "every_k":
        return tuple(SavePolicy(frozenset()) if i % k == 0 else None for i in range(len(blocks)))
    if name == "selective_op":
        return tuple(selective_op_policy(block) for block in blocks)
    raise ValueError(f"compile plan: {name!r} is no fixed candidate; valid: {', '.join(FIXED_CANDIDATES)}")


def _fixed_check_row(name: str, policies, blocks: list[BlockOps], costs: PlanCosts, pointwise_weight: float) -> FixedCheck:
    """``policies``' recomputation and eager-segment prediction (``PolicyCosts``' rule: ``none``'s segment for a
    block without a checkpoint, ``full``'s plus the saved bytes otherwise; option 1 is every block's empty save
    set, ``full``); ``simulated_peak`` is filled by the caller."""
    flops, cost, peak, below = 0, 0.0, costs.before, 0
    for i, (policy, block) in enumerate(zip(policies, blocks)):
        if policy is None:
            kept, reach = costs.kept[i][0], costs.reach[i][0]
        else:
            entry = _entry(block, [j for j, op in enumerate(block.ops) if op.key in policy.saved], pointwise_weight)
            flops, cost = flops + entry.flops, cost + entry.cost
            kept, reach = costs.kept[i][1] + entry.bytes, costs.reach[i][1] + entry.bytes
        peak, below = max(peak, below + reach), below + kept
    return FixedCheck(name, flops, cost, peak, 0)


def plan_compiled(
    model: nn.Module, budget: str | int | float, shape: tuple[int, int], source: CostSource, *, blocks=None,
    step: StepFn | None = None, pointwise_weight: float | None = None, where: str = "activation.budget",
    compiled_peak: CompiledPeak | None = None, max_replans: int = MAX_REPLANS,
    fixed_candidates: Iterable[str] = FIXED_CANDIDATES,
) -> CompilePlan:
    """The compiled plan of ``model`` at ``shape`` = (batch, seq) for ``budget`` (``config.budget.BudgetSpec``: a
    size, a fraction of the no-checkpointing peak, ``"min"`` or ``"min + 30%"``; whole-step peak bytes, as the
    ``budget`` strategy's). ``source`` measures or simulates the step's ``none`` and ``full`` segments. A budget
    below the smallest achievable peak is ``BudgetTooSmall``, naming ``where``, the minimum and the shape.

    ``compiled_peak`` (policies -> the compiled step's whole-step peak bytes; ``simulate.compiled.compiled_peak_check``)
    checks the plan compiled: while the simulated peak is over the budget, the plan is solved again within the budget
    less the prediction's error (simulated - predicted), at least one byte below the last prediction, so each re-plan
    steps down the Pareto front, at most ``max_replans`` times and never below the minimum. The plan returned is the
    first that holds compiled, else the last one tried (``CompilePlan.holds_compiled`` False, said in its note). The
    budget, the minimum and the no-checkpointing peak stay the ones stated; every simulated plan is a
    ``CompiledCheck``.

    A compiled-checked plan is then priced against the fixed strategies (``fixed_candidates``, by default
    ``FIXED_CANDIDATES``, as per-block policies: ``fixed_policies``): in order of the cost model's recomputation,
    each that recomputes less than the solved plan (any, when the solved plan does not hold compiled) is simulated
    compiled with ``compiled_peak``, and the first that fits the budget is the plan (``CompilePlan.fixed``; its
    row in ``fixed_checks``, every priced one is). So the plan kept fits compiled whenever a priced fixed strategy
    does, and recomputes no more than the solved plan; ``compiled_peak`` may cache by policies (the fixed
    strategies' policies are the same at every budget of a shape)."""
    policy_costs = PolicyCosts(model, source, blocks, step, pointwise_weight)
    planner = BudgetPlanner(BudgetSpec.parse(budget), policy_costs, where)
    shape_plan = planner.plan(*shape)
    menus = policy_costs.menu(*shape)
    plan = CompilePlan(_policies(menus, shape_plan), shape_plan, all(m.exact for m in menus))
    if compiled_peak is None:
        return plan
    checks, solve_budget = [], shape_plan.budget_bytes
    while True:
        simulated = int(compiled_peak(plan.policies))
        checks.append(CompiledCheck(plan.names, solve_budget, plan.shape_plan.plan.predicted_peak, simulated))
        predicted = plan.shape_plan.plan.predicted_peak
        target = min(shape_plan.budget_bytes - (simulated - predicted), predicted - 1)
        if simulated <= shape_plan.budget_bytes or len(checks) > max_replans or predicted <= shape_plan.min_peak:
            return _against_fixed(replace(plan, compiled_checks=tuple(checks)), policy_costs.ops[tuple(shape)],
                                  compiled_peak, fixed_candidates, policy_costs.pointwise_weight)
        solve_budget = max(target, shape_plan.min_peak)  # the least-memory plan is the last one the front has
        solved = solve(shape_plan.costs, solve_budget)
        tightened = replace(shape_plan, options=solved.names(shape_plan.costs), plan=solved)
        plan = CompilePlan(_policies(menus, tightened), tightened, plan.exact_menus)


def _against_fixed(plan: CompilePlan, blocks: list[BlockOps], compiled_peak: CompiledPeak, names: Iterable[str],
                   pointwise_weight: float) -> CompilePlan:
    """``plan`` (compiled-checked) or the fixed strategy with the least recomputation below it that fits the
    budget compiled (``plan_compiled``'s docstring)."""
    budget, costs = plan.shape_plan.budget_bytes, plan.shape_plan.costs
    candidates = [(name, fixed_policies(name, blocks)) for name in names]
    same = next((name for name, policies in candidates if policies == plan.policies), None)
    if same is not None:  # the solved plan is a fixed strategy: checked compiled already
        return replace(plan, fixed=same)
    rows = [(_fixed_check_row(name, policies, blocks, costs, pointwise_weight), policies) for name, policies in candidates]
    rows.sort(key=lambda row: row[0].cost)
    solved_cost, holds = plan.shape_plan.plan.cost, bool(plan.holds_compiled)
    priced: list[FixedCheck] = []
    for row, policies in rows:
        if holds and row.cost >= solved_cost:
            break  # recomputes no less than the solved plan, which fits: nothing left to win
        row = replace(row, simulated_peak=int(compiled_peak(policies)))
        priced.append(row)
        if row.simulated_peak <= budget:
            return replace(plan, policies=policies, fixed_checks=tuple(priced), fixed=row.name)
    return replace(plan, fixed_checks=tuple(priced))


def _policies(menus: list[BlockMenu], shape_plan: ShapePlan) -> tuple[SavePolicy | None, ...]:
    policies = []
    for menu, option in zip(menus, shape_plan.block_options()):
        if option == NONE:
            policies.append(None)
        else:
            policies.append(menu.entries[min(option.index, len(menu.entries) - 1)].policy)
    return tuple(policies)


# ---- the policy torch runs, and per-block compile around it -----------------------------------------------------

def _decide(policy: SavePolicy, counts: Counter, ctx, func, *args, **kwargs) -> CheckpointPolicy:
    """The selective-checkpoint policy: count the overload's calls (forward and recomputation apart) and save the
    ones the plan names."""
    name = str(func)
    mode = (ctx.is_recompute, name)
    occurrence = counts[mode]
    counts[mode] += 1
    return CheckpointPolicy.MUST_SAVE if (name, occurrence) in policy.saved else CheckpointPolicy.PREFER_RECOMPUTE


def policy_contexts(policy: SavePolicy):
    """``context_fn`` of a checkpoint under ``policy``: fresh call counts per checkpointed call (torch calls it once
    per call, and once per trace when compiling). Used as ``functools.partial(policy_contexts, policy)``: Dynamo
    traces a module-level function or a partial of one as ``context_fn``, not a lambda or a closure."""
    return create_selective_checkpoint_contexts(functools.partial(_decide, policy, Counter()))


def install_policy_forwards(model: nn.Module, policies: Iterable[SavePolicy | None], blocks=None) -> list[nn.Module]:
    """Each block's forward run as ``checkpoint(forward, context_fn=partial(policy_contexts, policy))``, or left
    as it is for None; nothing compiled yet (``compile_blocks``, or a compiled scenario's ``runner.compiled``,
    compiles each block around it). Returns the blocks."""
    blocks = list(blocks if blocks is not None else get_blocks(model))
    policies = list(policies)
    if len(policies) != len(blocks):
        raise ValueError(f"compile plan: {len(policies)} policies for {len(blocks)} blocks")
    for block, policy in zip(blocks, policies):
        if policy is not None:
            context_fn = functools.partial(policy_contexts, policy)

            def forward(*args, inner=block.forward, context_fn=context_fn, **kwargs):
                return checkpoint(inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

            block.forward = forward
    return blocks


def compile_blocks(model: nn.Module, policies: Iterable[SavePolicy | None], blocks=None, **compile_options) -> None:
    """Each block compiled (``nn.Module.compile``, torchtitan's per-block way) with its checkpoint inside the
    compiled region (``install_policy_forwards``). ``compile_options`` go to ``torch.compile`` (mode, fullgraph,
    ...)."""
    for block in install_policy_forwards(model, policies, blocks):
        block.compile(**compile_options)
