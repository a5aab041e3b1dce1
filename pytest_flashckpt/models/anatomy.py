"""A model's anatomy by module name: where its decoder blocks are and which module of a block does what.

Every strategy that must know *what* a block's modules are (the op-level selective policy, the budget planner's
options, FLOP counting, the save strategies, export) reads it from here instead of guessing from a position in
forward order or from the project's own GPT parameter names. A GPT block runs 4 matmul modules and a Llama block
7; labelling them by position would mislabel one of them silently. A Mixture-of-Experts block runs one router and
three matmuls per expert: a role may name a group of modules with a ``*`` segment (``mlp.experts.*.up_proj``,
``role_modules``), so every expert has its place without one role per expert.

A model states its anatomy with an ``anatomy()`` method (the project's families do); for a model that cannot, a
*discoverer* registered with ``register_discoverer`` recognises it (``models.families`` registers the Hugging Face
one when the package is imported; it imports the adapter only when it meets a transformers model). The blocks are
an ``nn.ModuleList`` or an ``nn.ModuleDict`` (torchtitan's ``layers``), in order.
``check_block`` holds a block to its anatomy: every named projection exists and is a matmul module, and no matmul
module of the block is left without a role, so a wrong anatomy is an error naming the block and the modules.

Op-level policies label a matmul by the role of the module that runs it: ``role_hooks`` puts forward pre/post
hooks on the role modules that set ``current_role()`` (a context variable) while that module runs, so the policy
that sees ``aten.mm`` / ``aten.addmm`` / ``aten.bmm`` knows it is, say, the ``o`` projection. (transformers'
``Conv1D``, GPT-2's projection module, lowers to ``addmm`` as ``nn.Linear`` does.)
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import torch.nn as nn

__all__ = [
    "PROJECTION_ROLES",
    "BlockAnatomy",
    "ModelAnatomy",
    "block_containers",
    "block_names",
    "check_block",
    "container_blocks",
    "current_role",
    "get_anatomy",
    "get_blocks",
    "is_matmul_module",
    "register_discoverer",
    "role_hooks",
    "role_modules",
]

# A decoder block's matmul modules by role: fused qkv (GPT) or separate q/k/v (Llama); the attention output
# projection o; the MLP's up (and gate, for a gated MLP such as SwiGLU) and down projections. A Mixture-of-Experts
# block (models.moe) adds its router, the routed experts' projections (one role each over all experts, named with
# a ``*`` segment: ``mlp.experts.*.up_proj``) and Qwen-MoE's shared-expert gate; its shared expert is a plain
# gate/up/down MLP.
PROJECTION_ROLES: tuple[str, ...] = (
    "qkv", "q", "k", "v", "o", "up", "gate", "down", "router", "expert_gate", "expert_up", "expert_down",
    "shared_expert_gate",
)
# In a projection's module name, a segment that stands for every entry of the container at that point (the experts)
EVERY = "*"


@dataclass(frozen=True)
class BlockAnatomy:
    """One decoder block by module name, relative to the block.

    ``projections``: role -> submodule, e.g. GPT ``{"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc",
    "down": "mlp.c_proj"}``; a ``*`` segment names one module per entry of a container, so one role covers every
    expert of a MoE block (``"expert_up": "mlp.experts.*.up_proj"``, see ``role_modules``); ``attention``: the submodule whose forward calls the attention kernel; ``norms``: the
    block's normalisation modules in forward order."""

    projections: Mapping[str, str]
    attention: str
    norms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.projections) - set(PROJECTION_ROLES))
        if unknown:
            raise ValueError(
                f"block anatomy: unknown projection role(s) {', '.join(unknown)}; valid: {', '.join(PROJECTION_ROLES)}"
            )
        if "qkv" in self.projections and set(self.projections) & {"q", "k", "v"}:
            raise ValueError("block anatomy: name either a fused 'qkv' projection or separate 'q'/'k'/'v', not both")
        modules = list(self.projections.values())
        repeated = sorted({m for m in modules if modules.count(m) > 1})
        if repeated:
            raise ValueError(f"block anatomy: module(s) {', '.join(repeated)} given more than one role")
        object.__setattr__(self, "projections", dict(self.projections))
        object.__setattr__(self, "norms", tuple(self.norms))

    def role_of(self, module_name: str) -> str | None:
        """The role of the submodule called ``module_name`` (relative to the block; ``mlp.experts.3.up_proj``
        matches ``mlp.experts.*.up_proj``), or None."""
        parts = module_name.split(".")
        for role, name in self.projections.items():
            pattern = name.split(".")
            if len(pattern) == len(parts) and all(p in (EVERY, part) for p, part in zip(pattern, parts)):
                return role
        return None


@dataclass(frozen=True)
class ModelAnatomy:
    """A whole model by module name (dotted paths from the model's root).

    ``family``: ``gpt``, ``llama``, ``hf-gpt2``, ``hf-llama``, ``custom``...; ``blocks``: the ``nn.ModuleList`` (or
    ``nn.ModuleDict``) of decoder blocks (``blocks``, ``transformer.h``, ``model.layers``); ``embeddings``: the input embedding modules;
    ``head``: the output projection (None if the model has none); ``final_norm``: the norm before the head;
    ``tied``: (alias, owner) parameter-name pairs that share one storage, e.g. ``(("lm_head.weight",
    "wte.weight"),)`` for a tied head (savers store the owner once and restore the alias from it)."""

    family: str
    blocks: str
    block: BlockAnatomy
    embeddings: tuple[str, ...] = ()
    head: str | None = None
    final_norm: str | None = None
    tied: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "embeddings", tuple(self.embeddings))
        object.__setattr__(self, "tied", tuple(tuple(pair) for pair in self.tied))


Discoverer = Callable[[nn.Module], "ModelAnatomy | None"]
_DISCOVERERS: list[Discoverer] = []


def register_discoverer(fn: Discoverer) -> None:
    """Add ``fn`` to the discoverers ``get_anatomy`` asks (in registration order) about a model without an
    ``anatomy()`` method; ``fn`` returns an anatomy for models it recognises and None for the others.
    Registering the same function twice is a no-op."""
    if fn not in _DISCOVERERS:
        _DISCOVERERS.append(fn)


def get_anatomy(model: nn.Module) -> ModelAnatomy:
    """The model's anatomy: ``model.anatomy()`` if it defines one, else the first registered discoverer's answer.

    The families' discoverers (Hugging Face GPT-2 / Llama / Qwen2 layouts) are registered when the package is
    imported (``models.families``), so no import beyond ``pytest_flashckpt.activation`` is needed. Raises
    ValueError naming the model's class, the block containers it has and what to do when nobody knows it."""
    method = getattr(model, "anatomy", None)
    if callable(method):
        anatomy = method()
        if not isinstance(anatomy, ModelAnatomy):
            raise TypeError(f"{type(model).__name__}.anatomy() returned {type(anatomy).__name__}, not a ModelAnatomy")
        return anatomy
    for discover in _DISCOVERERS:
        anatomy = discover(model)
        if anatomy is not None:
            return anatomy
    containers = block_containers(model)
    found = ", ".join(f"{name} ({type(m).__name__} of {len(m)})" for name, m in containers) or "none"
    hint = f"blocks={containers[0][0]!r}" if containers else "blocks=[...]"
    raise ValueError(
        f"no anatomy for a {type(model).__name__}: it has no anatomy() method and no registered discoverer "
        f"recognises it (known layouts: the project's families, Hugging Face GPT-2 and Llama-style models). Its "
        f"block containers: {found}. Pass its blocks explicitly (apply_ac(..., {hint}): a ModuleList, ModuleDict, "
        "list of modules or a dotted path), give the model an anatomy() returning a "
        "pytest_flashckpt.models.anatomy.ModelAnatomy, or register a discoverer (register_discoverer)"
    )


def block_containers(model: nn.Module) -> list[tuple[str, nn.ModuleList | nn.ModuleDict]]:
    """The model's non-empty ``nn.ModuleList`` / ``nn.ModuleDict`` submodules (candidates for its decoder blocks),
    largest first: what an error suggests passing as ``blocks=``."""
    found = [(name, m) for name, m in model.named_modules() if name and isinstance(m, (nn.ModuleList, nn.ModuleDict)) and len(m)]
    return sorted(found, key=lambda item: -len(item[1]))


def container_blocks(container: object) -> list[nn.Module] | None:
    """The blocks held by ``container``: an ``nn.ModuleList`` or a plain list/tuple of modules in order, an
    ``nn.ModuleDict`` in its insertion order (torchtitan's ``model.layers``, keyed "0", "1", ...); None if it is
    none of these or holds something that is not a module."""
    if isinstance(container, nn.ModuleDict):
        items = list(container.values())
    elif isinstance(container, (nn.ModuleList, nn.Sequential, list, tuple)):
        items = list(container)
    else:
        return None
    return items if all(isinstance(b, nn.Module) for b in items) else None


def get_blocks(model: nn.Module, anatomy: ModelAnatomy | None = None) -> nn.ModuleList | list[nn.Module]:
    """The model's decoder blocks, in order: the ``nn.ModuleList`` at ``anatomy.blocks`` itself, or the values of the
    ``nn.ModuleDict`` there, as a list."""
    anatomy = anatomy if anatomy is not None else get_anatomy(model)
    try:
        container = model.get_submodule(anatomy.blocks)
    except AttributeError:
        raise ValueError(
            f"{anatomy.family} anatomy names blocks {anatomy.blocks!r}, but a {type(model).__name__} has no such submodule"
        ) from None
    blocks = container_blocks(container) if isinstance(container, (nn.ModuleList, nn.ModuleDict)) else None
    if not blocks:
        raise ValueError(
            f"{anatomy.family} anatomy names blocks {anatomy.blocks!r}, which is {'an empty' if blocks == [] else 'a'} "
            f"{type(container).__name__}, not a non-empty nn.ModuleList or nn.ModuleDict of blocks"
        )
    return container if isinstance(container, nn.ModuleList) else blocks


def block_names(model: nn.Module, blocks: list[nn.Module]) -> list[str]:
    """Each block's dotted name in the model (``blocks.3``, ``model.layers.3``; ``blocks[i]`` for a block that is
    not a submodule), for errors."""
    by_id = {id(m): name for name, m in model.named_modules()}
    return [by_id.get(id(b), f"blocks[{i}]") for i, b in enumerate(blocks)]


def is_matmul_module(module: nn.Module) -> bool:
    """An ``nn.Linear`` (or subclass) or transformers' ``Conv1D`` (GPT-2's projections: a Linear with the weight
    transposed, lowered to ``addmm`` too). Recognised by name so this module never imports transformers."""
    if isinstance(module, nn.Linear):
        return True
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers")


def role_modules(block: nn.Module, name: str) -> list[tuple[str, nn.Module]]:
    """The (dotted name, module) pairs a projection's module name stands for in ``block``: one for a plain name,
    one per entry of the container at each ``*`` segment (in order) for ``mlp.experts.*.up_proj``; none if a
    segment is missing."""
    found: list[tuple[str, nn.Module]] = [("", block)]
    for segment in name.split("."):
        step = []
        for prefix, module in found:
            children = list(module.named_children()) if segment == EVERY else [(segment, module._modules.get(segment))]
            step.extend((f"{prefix}.{child_name}" if prefix else child_name, child)
                        for child_name, child in children if child is not None)
        found = step
    return found


def check_block(anatomy: ModelAnatomy | BlockAnatomy, block: nn.Module, where: str = "block") -> None:
    """Hold ``block`` to its anatomy: every named projection exists and is a matmul module, the attention and norm
    modules exist, and no matmul module of the block is left without a role.

    ``where`` names the block in the error (``blocks.3``). Raises ValueError naming the block and the modules."""
    block_anatomy = anatomy.block if isinstance(anatomy, ModelAnatomy) else anatomy
    modules = dict(block.named_modules())
    problems: list[str] = []
    named: set[str] = set()
    for role, name in block_anatomy.projections.items():
        found = role_modules(block, name)
        if not found:
            problems.append(f"projection {role!r} names {name!r}, which the block does not have")
        for full_name, module in found:
            named.add(full_name)
            if not is_matmul_module(module):
                problems.append(f"projection {role!r} names {full_name!r}, a {type(module).__name__}, not a Linear or Conv1D")
    for kind, names in (("attention", (block_anatomy.attention,)), ("norm", block_anatomy.norms)):
        for name in names:
            if name not in modules:
                problems.append(f"{kind} module {name!r} is not in the block")
    unlabelled = [name for name, module in modules.items() if name not in named and is_matmul_module(module)]
    if unlabelled:
        problems.append(
            f"matmul module(s) without a role: {', '.join(unlabelled)} (give each a role among {', '.join(PROJECTION_ROLES)})"
        )
    if problems:
        have = ", ".join(name for name, module in modules.items() if is_matmul_module(module)) or "none"
        raise ValueError(
            f"{where} ({type(block).__name__}) does not match its anatomy: " + "; ".join(problems) + f". Its matmul modules: {have}"
        )


_CURRENT_ROLE: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("flashckpt_role", default=())


def current_role() -> str | None:
    """The role of the innermost role module running now (set by ``role_hooks``), or None outside them."""
    stack = _CURRENT_ROLE.get()
    return stack[-1] if stack else None


class RoleHooks:
    """The hook handles ``role_hooks`` installed; ``remove()`` takes them all off."""

    def __init__(self, handles: list) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def __iter__(self) -> Iterator:
        return iter(self.handles)


def role_hooks(block: nn.Module, anatomy: ModelAnatomy | BlockAnatomy) -> RoleHooks:
    """Forward pre/post hooks on the block's role modules that set ``current_role()`` while each runs (in the
    original forward and in a checkpoint's recomputation alike, since both run the module's forward)."""
    block_anatomy = anatomy.block if isinstance(anatomy, ModelAnatomy) else anatomy
    handles = []
    for role, name in block_anatomy.projections.items():
        for _name, module in role_modules(block, name):
            _hook_role(module, role, handles)
    return RoleHooks(handles)


def _hook_role(module: nn.Module, role: str, handles: list) -> None:
    """Pre/post forward hooks that push ``role`` on the role stack while ``module`` runs (handles appended)."""

    def enter(_module, _args) -> None:
        _CURRENT_ROLE.set(_CURRENT_ROLE.get() + (role,))

    def leave(_module, _args, _output) -> None:
        stack = _CURRENT_ROLE.get()
        _CURRENT_ROLE.set(stack[:-1])

    handles.append(module.register_forward_pre_hook(enter))
    handles.append(module.register_forward_hook(leave, always_call=True))
