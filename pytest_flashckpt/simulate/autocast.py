"""Autocast on the ``meta`` device: torch's mixed-precision cast policy, applied where torch does not apply it.

``torch.autocast`` does nothing to meta tensors (torch 2.13): its kernels live under per-backend dispatch keys
(``AutocastCPU``, ``AutocastCUDA``, ...) that a meta tensor's key set does not carry (``Meta, ADInplaceOrView,
AutogradMeta``), and its casts only take tensors on the autocast device. A mixed-precision step simulated on meta
would then run in float32 throughout. ``MetaAutocast`` is a ``TorchFunctionMode`` that applies the cast policy of
the *target* device's autocast to meta tensors, above autograd as torch's does (the casts are recorded by autograd,
so what backward keeps is what a real run keeps):

- ``lower``: every floating tensor argument (float64 excepted) is cast to the autocast dtype (matmuls, linear,
  attention); float32 leaves that require grad (the master weights) are cast once and the cast is cached until
  autocast is left, as torch's weight-cast cache does;
- ``fp32``: floating arguments are cast to float32 (the CPU's losses; CUDA's norms, exp/log/pow, losses);
- ``fp32_opt_dtype``: the op is asked for a float32 result (``dtype=torch.float32``) unless a dtype was given
  (CUDA's softmax, log_softmax, sum, cumsum, prod, norms);
- ``promote``: floating arguments are cast to the widest among them (CPU: cat, stack, index_copy).

When autocast is on is torch's own state: the step runs under ``torch.autocast("cpu", dtype)`` (which leaves meta
tensors alone) and the mode reads ``torch.is_autocast_enabled("cpu")``. So activation checkpointing's recompute,
which re-enters the CPU autocast state it saw in the forward, is cast as in a real run (see ``_Scope``). The
weight-cast cache is dropped when torch drops its own: when the outermost autocast exits. So the bf16 casts of
every block's weights, checkpointed blocks' too, are alive at the loss: with checkpointing a mixed step peaks there.

The policy tables hold the ops a transformer step calls, as torch 2.13 registers them (``aten/src/ATen/
autocast_mode.cpp`` and ``.h``). An op that torch registers an autocast kernel for (``_has_kernel``) but the table
does not name raises instead of running uncast: a new model's op is never silently mis-modelled. Checked: the cpu
table against real CPU autocast op by op (``tests/simulate/test_simulate_mixed.py``), and whole steps to the byte.
The cuda table is not checked against a GPU here.
"""

from __future__ import annotations

import weakref
from functools import lru_cache

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

_LOWER_COMMON = ("linear", "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "scaled_dot_product_attention",
                 "linalg_vecdot", "prelu", "conv1d", "conv2d", "conv3d")
_FP32_LOSSES = ("nll_loss", "nll_loss2d", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
                "binary_cross_entropy_with_logits", "poisson_nll_loss", "cosine_embedding_loss", "hinge_embedding_loss",
                "margin_ranking_loss", "soft_margin_loss", "multi_margin_loss", "multilabel_margin_loss",
                "triplet_margin_loss", "cdist")

POLICY: dict[str, dict[str, str]] = {
    "cpu": {
        **dict.fromkeys((*_LOWER_COMMON, "_addmm_activation"), "lower"),
        **dict.fromkeys((*_FP32_LOSSES, "cross_entropy_loss", "prod"), "fp32"),
        **dict.fromkeys(("cat", "stack", "index_copy"), "promote"),
    },
    "cuda": {
        **dict.fromkeys((*_LOWER_COMMON, "addmv", "addr", "mv", "einsum", "chain_matmul", "linalg_multi_dot"), "lower"),
        **dict.fromkeys((*_FP32_LOSSES, "layer_norm", "native_layer_norm", "group_norm", "rms_norm", "exp", "expm1",
                         "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "pow", "softplus", "logsumexp",
                         "cosine_similarity", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "dist", "pdist",
                         "renorm", "frobenius_norm", "nuclear_norm"), "fp32"),
        **dict.fromkeys(("softmax", "log_softmax", "sum", "prod", "cumsum", "cumprod", "linalg_vector_norm",
                         "linalg_matrix_norm"), "fp32_opt_dtype"),
        **dict.fromkeys(("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put",
                         "scatter_add", "tensordot"), "promote"),
        # cross_entropy has no CUDA autocast kernel: torch decomposes it (log_softmax in the logits' dtype, given
        # explicitly, so autocast keeps it; then nll_loss, which autocast casts to float32); modelled as that
        "cross_entropy_loss": "cuda_cross_entropy",
    },
}
DISPATCH_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
# Python names that are not the aten op's name (functional wrappers, operators)
_ATEN_NAMES = {"cross_entropy": "cross_entropy_loss", "__matmul__": "matmul", "__rmatmul__": "matmul"}
# the simulator's explicit attention ops stand in for F.scaled_dot_product_attention (simulate.kernels)
_EXPLICIT_ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def aten_name(func) -> str:
    """The aten op a torch function call reaches (``torch.ops.aten.X.y`` -> X; ``F.cross_entropy`` ->
    cross_entropy_loss; ``Tensor.__matmul__`` -> matmul)."""
    schema = getattr(func, "_schema", None)
    name = schema.name.removeprefix("aten::") if schema is not None else getattr(func, "__name__", "")
    name = _ATEN_NAMES.get(name, name)
    return "scaled_dot_product_attention" if name in _EXPLICIT_ATTENTION else name


@lru_cache(maxsize=None)
def _has_kernel(name: str, target: str) -> bool:
    """Whether torch registers an autocast kernel for any overload of aten op ``name`` on ``target``."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None or not name.isidentifier():
        return False
    try:
        overloads = packet.overloads()
    except (AttributeError, RuntimeError):
        return False
    key = DISPATCH_KEYS[target]
    for overload in overloads:
        qualified = f"aten::{name}" if overload == "default" else f"aten::{name}.{overload}"
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
                return True
        except RuntimeError:
            continue
    return False


class MetaAutocast(TorchFunctionMode):
    """Apply ``target``'s autocast policy to meta tensors while ``torch.is_autocast_enabled("cpu")``."""

    def __init__(self, target: str) -> None:
        super().__init__()
        if target not in POLICY:
            raise ValueError(f"no autocast policy for target {target!r}; valid: {', '.join(POLICY)}")
        self.target = target
        self.policy = POLICY[target]
        self.cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self.casts = 0  # casts made (cache hits excluded), for tests

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        name = aten_name(func)
        policy = self.policy.get(name)
        if policy is None:
            if _has_kernel(name, self.target):
                raise NotImplementedError(
                    f"torch's {self.target} autocast has a cast policy for aten::{name}, which the meta autocast "
                    f"model does not know; add it to pytest_flashckpt.simulate.autocast.POLICY[{self.target!r}]"
                )
            return func(*args, **kwargs)
        lower = torch.get_autocast_dtype("cpu")
        if policy == "lower":
            args, kwargs = self._cast(args, lower), self._cast(kwargs, lower)
        elif policy == "fp32":
            args, kwargs = self._cast(args, torch.float32), self._cast(kwargs, torch.float32)
        elif policy == "fp32_opt_dtype":
            given = "dtype" in kwargs and kwargs["dtype"] is not None or any(isinstance(a, torch.dtype) for a in args)
            if not given and args and _eligible(args[0]):
                kwargs = {**kwargs, "dtype": torch.float32}
        elif policy == "promote":
            widest = None
            for t in _tensors((args, kwargs)):
                widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
            if widest is not None:
                args, kwargs = self._cast(args, widest), self._cast(kwargs, widest)
        elif policy == "cuda_cross_entropy":
            return self._cuda_cross_entropy(*args, **kwargs)
        return func(*args, **kwargs)

    def _cast(self, tree, dtype: torch.dtype):
        return tree_map(lambda t: self._cast_one(t, dtype) if _eligible(t) and t.dtype != dtype else t, tree)

    def _cast_one(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        cacheable = (dtype == torch.get_autocast_dtype("cpu") and tensor.dtype == torch.float32 and tensor.requires_grad
                     and tensor.is_leaf and not tensor._is_view() and torch.is_autocast_cache_enabled())
        if not cacheable:
            self.casts += 1
            return tensor.to(dtype)
        hit = self.cache.get(id(tensor))
        if hit is not None and hit[0]() is tensor:
            return hit[1]
        self.casts += 1
        cast = tensor.to(dtype)
        self.cache[id(tensor)] = (weakref.ref(tensor), cast)
        return cast

    def _cuda_cross_entropy(self, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                            reduction="mean", label_smoothing=0.0):
        """CUDA autocast's cross entropy for class-index targets: log_softmax in the input's dtype, its result cast
        to float32 for nll_loss (torch's decomposition, through which autocast sees only nll_loss)."""
        if label_smoothing or target.is_floating_point() or size_average is not None or reduce is not None:
            raise NotImplementedError("meta autocast models cross_entropy with class-index targets and no label smoothing")
        logp = torch.log_softmax(input, 1, dtype=input.dtype)
        logp, weight = self._cast((logp, weight), torch.float32)
        return torch.nn.functional.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)


def _eligible(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if _eligible(t)]


class _Scope:
    """``MetaAutocast`` for a whole step, backward included. The autograd engine runs the backward with no torch
    function mode, so activation checkpointing's recompute would run uncast; a global module pre-hook puts the mode
    back on for a module called while autocast is on and no function mode is (the recompute's modules), and the
    module's forward hook takes it off. Ops in a checkpointed block's own ``forward`` body outside any submodule
    are not cast in the recompute; checkpointing compares every recomputed tensor's dtype with the forward's and
    raises if that ever mattered, so it cannot go unnoticed."""

    def __init__(self, mode: MetaAutocast) -> None:
        self.mode = mode
        self._pushed: list[int] = []
        self._handles: list = []

    def _pre(self, module, _args) -> None:
        if torch.is_autocast_enabled("cpu") and not torch._C._is_torch_function_mode_enabled():
            self.mode.__enter__()
            self._pushed.append(id(module))

    def _post(self, module, _args, _output) -> None:
        if self._pushed and self._pushed[-1] == id(module):
            self._pushed.pop()
            self.mode.__exit__(None, None, None)

    def _clear(self) -> None:
        self._torch_clear()
        self.mode.cache.clear()

    def __enter__(self) -> "_Scope":
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._pre),
                         hooks.register_module_forward_hook(self._post, always_call=True)]
        # torch.autocast.__exit__ calls torch.clear_autocast_cache() when it leaves the outermost autocast: the
        # model's cache is dropped at that very moment (a real run frees its weight casts there)
        self._torch_clear = torch.clear_autocast_cache
        torch.clear_autocast_cache = self._clear
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        torch.clear_autocast_cache = self._torch_clear
        for handle in self._handles:
            handle.remove()


def meta_autocast(target: str) -> _Scope:
    """The context to enter around a simulated step: ``target``'s autocast policy on meta tensors."""
    return _Scope(MetaAutocast(target))
