"""The role policy: what torch's selective checkpointing (``create_selective_checkpoint_contexts``) saves in a
block that runs under a ``by_role`` or ``by_op`` option, decided from the op and the block's anatomy.

Per op the dispatcher hands it, the policy reads two things: which kind of op it is (``activation.ops``: a
Linear's matmul, an attention op, or neither) and, for a Linear's matmul, the anatomy role of the module running it
(``models.anatomy.current_role()``, set by ``role_hooks`` on the block's projection modules, in the forward and in
its recomputation alike): ``o`` for GPT's attn.c_proj, ``down`` for Llama's mlp.down_proj. A Linear matmul that
runs outside every role module is an ``UnlabelledMatmul`` error naming the block (for ``by_op`` only when the
block has an anatomy: ``BlockOption.strict``), so a wrong anatomy is never read as a silent "recompute".

- ``by_role``: MUST_SAVE when the op's role group (``options.ROLE_GROUP``; attention ops are ``attn``) is in the
  option's ``saves``, PREFER_RECOMPUTE otherwise.
- ``by_op``: MUST_SAVE when the op is one of the option's listed overloads and, for a Linear's matmul, its role is
  not in the option's ``recompute``; PREFER_RECOMPUTE otherwise. With ``matches`` (``OpMatches``) the listed ops
  seen in each training forward are counted, so a list that never fires (a kernel that is not the one that ran,
  e.g. only CUDA flash ops on a CPU) is an error at the first training forward instead of a silent "full
  recompute of the pointwise ops, nothing saved" run.

Either way, an op that would be saved but draws random numbers in this call (attention with ``dropout_p > 0``) is
recomputed instead: a saved output is replayed without running the op, so the RNG offset it would have advanced
(CUDA's philox offset) is not advanced, and every later random op in the recomputed region (the residual dropout)
would draw a different mask than in the forward: wrong gradients. Recomputed in order from the restored RNG state,
every mask is the same bit for bit.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

import torch
import torch.fx.traceback as fx_traceback
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from pytest_flashckpt.activation import ops
from pytest_flashckpt.activation.options import ROLE_GROUP, BlockOption
from pytest_flashckpt.models.anatomy import BlockAnatomy, current_role


class UnlabelledMatmul(ValueError):
    """A block ran a Linear matmul outside every projection its anatomy names (so no role could be read)."""


class OpMatches:
    """The listed ops a ``by_op`` policy saw since ``reset()``: ``matched`` (listed op name -> calls in the original
    forward; recomputation is not counted, so the numbers are per training forward) and ``seen`` (every op the policy was asked about, which makes
    the "matched nothing" error say what to list instead)."""

    def __init__(self) -> None:
        self.matched: Counter[str] = Counter()
        self.seen: set[str] = set()

    def reset(self) -> None:
        self.matched.clear()
        self.seen.clear()

    def check(self, names: tuple[str, ...]) -> None:
        """Raise if none of ``names`` ran in the last forward (the list would save nothing). A forward that never
        asked the policy (``seen`` empty) ran compiled code, where the policy was asked while tracing: checked then."""
        if self.matched or not self.seen:
            return
        ran = ", ".join(sorted(self.seen)) or "(no ops)"
        raise RuntimeError(
            f"selective_op: none of the configured save ops ran during the forward ({', '.join(names)}); "
            f"the policy would save nothing and recompute the whole block. Ops that ran: {ran}"
        )


@lru_cache(maxsize=None)
def listed_ops(names: tuple[str, ...]) -> dict:
    """Overload -> name for a ``by_op`` list (each name resolved: ValueError for one that does not exist)."""
    return {ops.resolve_op(name): name for name in names}


class RolePolicy:
    """The policy of one checkpointed forward of the block ``where`` under ``option`` (see the module docstring)."""

    def __init__(self, option: BlockOption, where: str = "block", matches: OpMatches | None = None,
                 block: BlockAnatomy | None = None) -> None:
        if not option.reads_roles:
            raise ValueError(f"block option {option.name!r} saves nothing selectively; it has no role policy")
        self.option = option
        self.where = where
        self.matches = matches
        self.block = block  # the block's anatomy: the role of a traced matmul under torch.compile (traced_role)
        self.listed = listed_ops(option.ops) if option.kind == "by_op" else {}

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        option = self.option
        projection = self._projection(func)
        if option.kind == "by_role":
            group = ROLE_GROUP[projection] if projection is not None else ("attn" if ops.is_attention(func) else None)
            name = None
            save = group is not None and group in option.saves
        else:
            name = self.listed.get(func)
            if self.matches is not None and not ctx.is_recompute:
                self.matches.seen.add(str(func))
                if name is not None:
                    self.matches.matched[name] += 1
            save = name is not None and (projection is None or projection not in option.recompute)
        if save and ops.consumes_rng(func, args, kwargs):
            save = False
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    def _projection(self, func) -> str | None:
        """The anatomy role of the module running a Linear's matmul (None for other ops, and for a Linear's matmul
        outside every role module of a block given without an anatomy)."""
        if not ops.is_linear(func):
            return None
        role = current_role()
        if role is None and self.block is not None and torch.compiler.is_compiling():
            role = traced_role(self.block)
        if role is None and self.option.strict:
            raise UnlabelledMatmul(
                f"{self.where} ran {func} outside every projection of its anatomy: a matmul module without a role "
                "(or a functional linear on a raw weight), so no role can be read; its anatomy must name every "
                "matmul module"
            )
        return role


def contexts(option: BlockOption, where: str = "block", matches: OpMatches | None = None,
             block: BlockAnatomy | None = None):
    """``checkpoint(context_fn=...)``'s contexts for one checkpointed forward of block ``where`` under ``option``."""
    return create_selective_checkpoint_contexts(RolePolicy(option, where, matches, block))


def traced_role(block: BlockAnatomy) -> str | None:
    """The role of the module running the op being traced now, under ``torch.compile``: there the policy is asked
    while AOTAutograd traces the checkpointed region (once per compile, not per step), the role hooks do not run
    (Dynamo cannot trace their ``ContextVar``), and the node being traced carries the module path Dynamo recorded
    (``nn_module_stack``: ``L['self'].forward.__self__.attn.c_proj``); its longest tail that the block's anatomy
    names is the role. None outside a trace or outside every role module."""
    meta = fx_traceback.get_current_meta()
    stack = meta.get("nn_module_stack") if meta else None
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    parts = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path).split(".")
    return next((role for i in range(len(parts)) if (role := block.role_of(".".join(parts[i:]))) is not None), None)
