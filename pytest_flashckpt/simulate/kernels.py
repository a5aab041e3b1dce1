"""Which attention op a simulated step calls on ``meta``, for the device it predicts.

On ``meta``, ``F.scaled_dot_product_attention`` takes its math path (it materialises the T x T scores), which
is not what a GPU or a CPU runs; so the simulated model calls the kernel's aten op explicitly (see
``models.attention.EXPLICIT_OPS``) and saves exactly what that kernel saves for backward. A Hugging Face model calls the same ops through
transformers' attention interface (``models.hf.attention``; its ``sdpa`` backend on meta is transformers' own SDPA
call without the mask preparation, which reads tensor values that meta tensors lack). The CUDA ops are only
ever run on ``meta`` here: a fake-CUDA flash-attention op aborts the process.

Grouped-query attention (Llama's ``n_kv_head``): the flash ops' meta functions take k and v with fewer heads than
q, forward and backward (gradients of k/v keep the KV heads), as FlashAttention-2 and the flash-attn package do on
a GPU, so a simulated flash step keeps k/v at their grouped size. The mem-efficient op's meta backward refuses
grouped heads (it returns gradients with the query heads), and SDPA in float32 on CUDA would pick that kernel, so
those paths get k/v repeated to every query head (``models.attention.repeat_kv``) on meta and on a GPU alike.
Checked on meta only (torch 2.13, no GPU in that session): whether the real CUDA flash op accepts GQA is
FlashAttention-2's documented behaviour, not a measurement of ours.
"""

from __future__ import annotations

TARGETS = ("cuda", "cpu")
KERNELS = ("flash", "flash_attn", "sdpa", "efficient", "cudnn", "eager")


def simulated_backend(kernel: str, target: str, dtype_name: str, dropout: float = 0.0) -> str:
    """The model backend that reproduces ``kernel`` on ``target``.

    - ``flash`` / ``flash_attn``: the CUDA flash kernel (output, float32 logsumexp (B, H, T), RNG seed/offset);
      the flash-attn package saves the same tensors (its ``rng_state`` is two int64 numbers).
    - ``sdpa``: what SDPA picks: on a CPU its flash kernel, or with dropout its math path (plain ``sdpa`` on
      meta, whose SDPA always takes the math path); on CUDA flash for 16-bit dtypes, else mem-efficient.
    - ``efficient``, ``cudnn``: those CUDA kernels (CUDA only).
    - ``eager``: the model's math attention (T x T scores), the same ops everywhere.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown simulation target {target!r}; valid: {', '.join(TARGETS)}")
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; valid: {', '.join(KERNELS)}")
    if kernel == "eager":
        return "eager"
    if target == "cpu":
        if kernel != "sdpa":
            raise ValueError(f"attention kernel {kernel!r} runs on CUDA only; on a CPU use sdpa or eager")
        return "sdpa" if dropout > 0 else "sdpa-flash-cpu"
    if kernel in ("flash", "flash_attn"):
        if dtype_name not in ("bfloat16", "float16"):
            raise ValueError(f"the flash kernel needs bfloat16 or float16, not {dtype_name}; use --kernel efficient or --dtype bf16")
        return "sdpa-flash"
    if kernel == "sdpa":
        return "sdpa-flash" if dtype_name in ("bfloat16", "float16") else "sdpa-mem-efficient"
    return {"efficient": "sdpa-mem-efficient", "cudnn": "sdpa-cudnn"}[kernel]
