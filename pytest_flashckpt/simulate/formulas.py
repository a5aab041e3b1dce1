"""One block's kept activations three ways: simulated, our analytic model (``activation.analytic``) and the
published formula of Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models":
s*b*h*(34 + 5*a*s/h) bytes per layer for 16-bit activations with dropout and math attention. Both are GPT-block
formulas: the simulation scenarios ask ``activation.analytic.supports`` first and leave them out for other families.

The differences are exact terms (``korthikanti_terms``), checked in ``tests/simulate/test_formulas.py``:

- Korthikanti's 34 = 32 (16 values of 2 bytes) + 2 one-byte dropout masks; our cards have dropout 0: no masks.
- 5*a*s/h: the s x s scores (2 bytes), the dropped scores (2) and their mask (1) per head; a flash kernel keeps
  none of them.
- Korthikanti leaves out LayerNorm's statistics: mean and rstd, float32, for both LayerNorms (16 bytes a token).
- A flash kernel keeps its float32 logsumexp (4*a bytes a token) and its RNG state; on meta the flash op returns
  the RNG seed (2 x uint64) and offset (1 x uint64) as device tensors: 24 bytes a block. (Real CUDA with dropout 0
  returns these as empty/CPU tensors in recent PyTorch: those 24 bytes are the one term meta may over-count.)
"""

from __future__ import annotations

from pytest_flashckpt.models.gpt import GPTConfig  # a GPT block's formula

FLASH_RNG_STATE_BYTES = 24  # meta's flash op: philox seed (2,) uint64 + offset () uint64


def korthikanti_block_bytes(config: GPTConfig, batch: int, seq: int) -> int:
    """s*b*h*(34 + 5*a*s/h): bytes one layer keeps, 16-bit, with dropout and materialised attention scores."""
    s, b, h, a = seq, batch, config.width, config.num_heads
    return s * b * h * 34 + 5 * a * s * s * b


def korthikanti_terms(config: GPTConfig, batch: int, seq: int, flash: bool) -> dict[str, int]:
    """The exact terms that turn Korthikanti's per-layer bytes into our 16-bit block's (dropout 0): add them up."""
    s, b, h, a = seq, batch, config.width, config.num_heads
    terms = {
        "korthikanti": korthikanti_block_bytes(config, batch, seq),
        "no dropout masks (2 x 1 byte)": -2 * s * b * h,
        "no dropped scores or their mask (2 + 1 bytes)": -3 * a * s * s * b,
        "LayerNorm mean/rstd (2 x 2 x fp32)": 16 * s * b,
    }
    if flash:
        terms["no softmax scores (flash)"] = -2 * a * s * s * b
        terms["flash logsumexp (fp32 per head)"] = 4 * a * s * b
        terms["flash RNG seed/offset on meta"] = FLASH_RNG_STATE_BYTES
    return terms
