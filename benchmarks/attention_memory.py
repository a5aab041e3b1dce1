"""Attention-only memory on a GPU: eager (PyTorch's standard attention, T x T scores) vs flash_attn, forward and
backward of one causal attention layer with dropout, as FlashAttention's paper measures its memory footprint (Dao
et al. 2022, Fig. 3: "up to 10x more memory efficient at sequence length 2K and 20x at 4K").

``python benchmarks/attention_memory.py --out DIR`` writes ``attention_memory.json`` and prints one line per length.
Memory is the cuda probe's peak (allocator, this region only) minus q, k, v, which both kernels hold alike.
Exits 1 when a published ratio does not hold (measured ratio below the claim), 0 otherwise; CUDA required.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from pytest_flashckpt.models.attention import causal_attention, resolve_backend
from pytest_flashckpt.probes import make_probe

CLAIMS = {2048: 10.0, 4096: 20.0}  # sequence length -> published memory ratio (standard / flash)


def attention_bytes(backend: str, seq: int, device: torch.device, batch: int = 8, heads: int = 12, head_dim: int = 64) -> int:
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in range(3))
    with make_probe("cuda", device).track(resident=[q, k, v]) as reading:
        out = causal_attention(q, k, v, backend, dropout_p=0.1)
        out.backward(torch.ones_like(out))
        del out
    return reading.peak_bytes - reading.start_bytes - sum(t.grad.numel() * 2 for t in (q, k, v))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    resolve_backend("flash_attn", device, torch.bfloat16)  # a clear error if flash-attn cannot run here
    rows, failed = [], False
    for seq, claim in CLAIMS.items():
        eager, flash = attention_bytes("eager", seq, device), attention_bytes("flash_attn", seq, device)
        ratio = eager / flash
        holds = ratio >= claim
        failed |= not holds
        rows.append({"seq_len": seq, "eager_bytes": eager, "flash_attn_bytes": flash, "ratio": ratio, "claim": claim, "holds": holds})
        print(f"attention memory s{seq}: eager {eager / 2**20:.0f} MiB, flash_attn {flash / 2**20:.0f} MiB, "
              f"{ratio:.1f}x (published {claim:g}x): {'holds' if holds else 'DOES NOT HOLD'}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_memory.json").write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
