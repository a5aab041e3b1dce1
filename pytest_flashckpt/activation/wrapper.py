"""One wrapper for every strategy: ``BlockForward`` runs a block's forward under its ``BlockOption``.

It stands in for the block's ``forward`` (an instance attribute, so no wrapper module is inserted and parameter
names, ``blocks.<i>.*``, which the save strategies rely on, stay exactly those of the plain model) and runs the
original forward, with whatever positional and keyword arguments the block takes (hidden states, rotary tables,
masks):

- ``none``, or any option while gradients are off (no graph, so nothing to save or recompute): the plain forward;
- ``offload``: under ``offload_context`` (``save_on_cpu(pin_memory=True)``; around a compiled block, hooks that keep
  each saved tensor's strides, ``save_on_host_keeping_strides``; the simulator swaps in hooks that do to device
  memory what it does, on ``meta`` where no data can be copied);
- ``full``: under ``torch.utils.checkpoint`` (non-reentrant, RNG state preserved, so recomputation reproduces
  dropout masks bit for bit);
- ``by_role`` / ``by_op``: the same, with the role policy's selective-checkpoint contexts (``activation.policy``).

``option`` may be switched between forwards (the budget strategy sets it per input shape). A switchable block
(``pin_inputs``) also holds its tensor inputs that need no gradient until the gradient of its output arrives,
whatever its option: a checkpointed block keeps its inputs for the recomputation anyway, and a model may pass its
blocks tensors it made before the first block and uses nowhere else (Hugging Face Llama's ``position_ids``, an
attention mask). Without the pin such a tensor would live into the backward pass only when some block below is
checkpointed, so a plan's peak would not be the sum of its blocks' measured costs (``budget.model``); with it, it
lives the same in every plan, which costs nothing where any block is checkpointed and those tensors' bytes (once:
every block is passed the same ones) where none is. The hidden states (they need a gradient) are not pinned, so an
offloaded block's input still leaves the device.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from torch.utils._pytree import tree_leaves

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from pytest_flashckpt.activation.blocks import block_names, resolve_blocks
from pytest_flashckpt.activation.options import NONE, BlockOption
from pytest_flashckpt.activation.policy import OpMatches, contexts
from pytest_flashckpt.models.anatomy import BlockAnatomy, ModelAnatomy, RoleHooks, role_hooks


COMPILED_WHERE = "a compiled block"  # how the policy's errors name a block traced by torch.compile


def save_on_host():
    """``offload``'s saved-tensor hooks on a real device: every saved tensor to pinned host memory."""
    return torch.autograd.graph.save_on_cpu(pin_memory=True)


def save_on_host_keeping_strides():
    """``offload``'s saved-tensor hooks around a compiled block: ``save_on_host``'s round trip, with each tensor
    brought back with the strides it was saved with. Inductor's compiled backward asserts the size and stride of
    every tensor it saved (``assert_size_stride``); ``save_on_cpu`` brings a saved view back contiguous, and the
    compiled backward fails on it (reports/spike-compiled-offload.md). The host copy stays compact (pinned where a
    GPU can pin it); the copy back is allocated at the saved strides, which for a view that skips elements spans its
    extent (``empty_strided``)."""
    pinnable = torch.cuda.is_available()

    def pack(tensor: torch.Tensor) -> tuple[torch.device, tuple[int, ...], torch.Tensor]:
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=pinnable)
        host.copy_(tensor, non_blocking=pinnable)
        return tensor.device, tensor.stride(), host

    def unpack(saved: tuple[torch.device, tuple[int, ...], torch.Tensor]) -> torch.Tensor:
        device, stride, host = saved
        back = torch.empty_strided(host.size(), stride, dtype=host.dtype, device=device)
        return back.copy_(host, non_blocking=pinnable)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class BlockForward:
    """Stands in for a block's ``forward``: runs the original one under ``option`` (see the module docstring).
    ``where`` names the block in errors; ``matches`` counts a ``by_op`` option's listed ops (``OpMatches``)."""

    def __init__(self, forward: Callable, option: BlockOption = NONE, where: str = "block",
                 offload_context: Callable = save_on_host, matches: OpMatches | None = None, pin_inputs: bool = False,
                 block: BlockAnatomy | None = None) -> None:
        self.forward = forward
        self.option = option
        self.where = where
        self.offload_context = offload_context
        self.matches = matches
        self.pin_inputs = pin_inputs
        self.block = block  # the block's anatomy, for the policy's roles under torch.compile (policy.traced_role)
        self.role_hooks: RoleHooks | None = None  # set by install_block_forwards; compiled, taken off (docs/compile.md)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = self._run(*args, **kwargs)
        if self.pin_inputs and torch.is_grad_enabled():
            pinned = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and not t.requires_grad]
            on_output_gradient(output, pinned.clear)
        return output

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        kind = self.option.kind
        if kind == "none" or not torch.is_grad_enabled():
            return self.forward(*args, **kwargs)
        if kind == "offload":
            with self.offload_context():
                return self.forward(*args, **kwargs)
        if kind == "full":
            return checkpoint(self.forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
        # a functools.partial of a module-level function, not a lambda: Dynamo traces a checkpoint inside a compiled
        # region only with a plain function or a partial as its context_fn, and guards on the partial's arguments,
        # so compiled blocks share one graph only when those are the same for every block: no block name there
        # (docs/compile.md)
        where = COMPILED_WHERE if torch.compiler.is_compiling() else self.where
        return checkpoint(self.forward, *args, use_reentrant=False, preserve_rng_state=True,
                          context_fn=functools.partial(contexts, self.option, where, self.matches, self.block), **kwargs)

    def __repr__(self) -> str:
        return f"BlockForward({self.option.name})"


def on_output_gradient(output: Any, fn: Callable[[], None]) -> None:
    """Call ``fn`` when the block's backward begins: when the first gradient of its output arrives (the tensor, or
    the first of the tensors with a graph in a tuple / dict a block returns: Falcon's and older transformers' blocks
    return ``(hidden_states, ...)``). Not when all have arrived: an extra output the block also uses inside (its
    attention output, say) gets its gradient in the middle of the block's own backward."""
    tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
    if len(tensors) == 1:
        tensors[0].register_hook(lambda _grad: fn())
    elif tensors:
        torch.autograd.graph.register_multi_grad_hook(tensors, lambda _grad: fn(), mode="any")


def is_wrapped(block: nn.Module) -> bool:
    """Whether a strategy already runs this block's forward."""
    return isinstance(block.__dict__.get("forward"), BlockForward)


def install_block_forwards(
    model: nn.Module, blocks: list[nn.Module], anatomy: ModelAnatomy | None, options: list[BlockOption],
    matches: OpMatches | None = None, switchable: bool = False,
) -> list[BlockForward]:
    """A ``BlockForward`` on each block with its option, and, where the option reads roles (every block when the
    options are ``switchable``: set later, per input shape) and the model has an anatomy, the role hooks that tell
    the policy which projection runs a matmul (``models.anatomy.role_hooks``); switchable blocks pin their inputs
    (see the module docstring). Raises RuntimeError if a block already runs under a strategy."""
    if len(options) != len(blocks):
        raise ValueError(f"a plan of {len(options)} block options for a model of {len(blocks)} blocks")
    if any(is_wrapped(block) for block in blocks):
        raise RuntimeError("an activation strategy is already applied to this model; build a fresh model instead")
    forwards = []
    for block, option, where in zip(blocks, options, block_names(model, blocks)):
        forward = BlockForward(block.forward, option, where, matches=matches, pin_inputs=switchable,
                               block=anatomy.block if isinstance(anatomy, ModelAnatomy) else anatomy)
        block.forward = forward
        forwards.append(forward)
        if anatomy is not None and (switchable or option.reads_roles):
            forward.role_hooks = role_hooks(block, anatomy)
    return forwards


def drop_role_hooks(blocks: list[nn.Module]) -> None:
    """Take a strategy's role hooks off ``blocks`` that are about to be compiled: Dynamo cannot trace their
    ``ContextVar``, and under compile the policy reads a matmul's role from the traced node instead
    (``activation.policy.traced_role``). The measured compiled step (``runner.compiled``) and the compiled-step
    simulator (``simulate.compiled``) both call this, so both compile the same blocks."""
    for block in blocks:
        forward = block.__dict__.get("forward")
        if isinstance(forward, BlockForward) and forward.role_hooks is not None:
            forward.role_hooks.remove()
            forward.role_hooks = None


def switchable_forwards(model: nn.Module, blocks: list[nn.Module] | None = None) -> list[BlockForward]:
    """``none`` on every block of ``model`` (its anatomy's, each checked, unless ``blocks`` is given), switchable:
    role hooks on every block with an anatomy. What a cost source measures each option on, and what the budget
    strategy sets per input shape."""
    found, anatomy = resolve_blocks(model, blocks)
    return install_block_forwards(model, found, anatomy, [NONE] * len(found), switchable=True)
