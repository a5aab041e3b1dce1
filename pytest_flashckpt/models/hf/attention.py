"""A Hugging Face model's attention as one explicit kernel op, for the simulator on ``meta``.

On ``meta``, transformers' ``sdpa`` attention calls ``F.scaled_dot_product_attention``, which takes its math path
there (it materialises the T x T scores), not the flash or mem-efficient kernel a GPU or a CPU runs. The project's
own models call the kernel's aten op explicitly in that case (``models.attention.EXPLICIT_OPS``); this module does
the same for transformers' models, through transformers' own attention interface: ``register()`` adds one
attention function per explicit op to ``AttentionInterface`` (``ALL_ATTENTION_FUNCTIONS``) under a name of
``ATTN_IMPLEMENTATION``, and a model built with ``attn_implementation=<that name>`` calls it in every layer. Each
function receives what transformers' ``sdpa_attention_forward`` receives (q, k, v as (B, heads, T, head_dim), the
model's ``scaling`` and ``dropout``) and returns what it returns ((B, T, heads, head_dim), contiguous), so the step
around the kernel is the model's own and only the kernel's saved tensors change. ``sdpa-math`` is transformers' own
SDPA call (for what takes SDPA's math path on the device predicted too: dropout on a CPU), registered here because
transformers' ``sdpa`` and ``eager`` prepare a causal mask by reading tensor values (a packed-sequence check), which
``meta`` tensors do not have; so on ``meta`` a model runs one of these names (``models.hf.card``).

The names hold neither "sdpa" nor "flash": transformers treats an implementation whose name contains them as its
own SDPA or FlashAttention integration (dispatch checks, flash-only input handling). No attention-mask function is
registered for them, so transformers builds no mask (as for its other custom kernels): the ops run causal, which is
the training step's attention (no padding). What a causal kernel cannot express is refused, naming the setting:
a sliding window shorter than the sequence, logit soft-capping, a non-causal module.

Grouped-query attention as in ``models.attention``: the flash ops (CPU and CUDA) take k/v with fewer heads, the
mem-efficient and cuDNN ops get k/v repeated to every query head. Importing this module does not import
transformers; ``register()`` does.
"""

from __future__ import annotations

import torch

from pytest_flashckpt.models.attention import repeat_kv

# explicit kernel (models.attention's label) -> the attn_implementation name it is registered under
ATTN_IMPLEMENTATION = {
    "sdpa-flash-cpu": "meta_kernel_cpu_fused",
    "sdpa-flash": "meta_kernel_cuda_fa2",
    "sdpa-mem-efficient": "meta_kernel_cuda_efficient",
    "sdpa-cudnn": "meta_kernel_cuda_cudnn",
    "sdpa-math": "meta_kernel_math",  # transformers' own SDPA call, for what takes SDPA's math path (dropout on a CPU)
}
_GQA_NATIVE = ("sdpa-flash-cpu", "sdpa-flash")  # as models.attention._GQA_NATIVE_OPS


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str, dropout: float, scale: float | None) -> torch.Tensor:
    """The explicit causal op of ``kernel`` on (B, heads, T, head_dim) tensors; its output (B, heads, T, head_dim)."""
    aten = torch.ops.aten
    if kernel == "sdpa-flash-cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout, True, scale=scale)[0]
    if kernel == "sdpa-flash":
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout, True, False, scale=scale)[0]
    if kernel == "sdpa-mem-efficient":
        return aten._scaled_dot_product_efficient_attention(q, k, v, None, q.requires_grad, dropout, True, scale=scale)[0]
    return aten._scaled_dot_product_cudnn_attention(q, k, v, None, q.requires_grad, dropout, True, False, scale=scale)[0]


def _refuse_what_a_causal_kernel_cannot_run(module, query: torch.Tensor, kwargs) -> None:
    if not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False:
        raise ValueError(f"{type(module).__name__} is not causal attention; the simulator's kernels run causal attention only")
    if kwargs.get("softcap") is not None:
        raise ValueError(f"{type(module).__name__}: attention logit soft-capping (softcap {kwargs['softcap']}) has no "
                         "flash/efficient kernel op to simulate; use kernel eager")
    window = kwargs.get("sliding_window")
    if window is not None and query.shape[2] > window:
        raise ValueError(f"{type(module).__name__}: sliding_window {window} is shorter than the sequence "
                         f"{query.shape[2]}; the simulated kernel ops attend to the whole causal prefix: use a sequence "
                         f"<= {window}, set sliding_window: null in the config, or use kernel eager")


def attention_function(kernel: str):
    """The transformers attention function that runs ``kernel`` (a key of ``ATTN_IMPLEMENTATION``)."""

    def forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs):
        if attention_mask is not None:
            raise ValueError(f"{type(module).__name__}: an explicit attention mask reached the simulated {kernel} op; "
                             "the simulator runs the causal training step without padding or masks")
        _refuse_what_a_causal_kernel_cannot_run(module, query, kwargs)
        if kernel == "sdpa-math":  # the same F.scaled_dot_product_attention call as transformers' sdpa, no mask
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
        n_rep = query.shape[1] // key.shape[1]
        if kernel not in _GQA_NATIVE:
            key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
        out = _kernel(query, key, value, kernel, dropout, scaling)
        return out.transpose(1, 2).contiguous(), None  # as sdpa_attention_forward: (B, T, heads, head_dim)

    forward.__name__ = f"{ATTN_IMPLEMENTATION[kernel]}_forward"
    return forward


def register() -> None:
    """Register every explicit kernel's attention function with transformers' ``AttentionInterface`` (idempotent)."""
    from transformers import AttentionInterface

    for kernel, name in ATTN_IMPLEMENTATION.items():
        AttentionInterface.register(name, attention_function(kernel))
