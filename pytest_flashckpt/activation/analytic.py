"""Analytic activation memory for our GPT (``models/gpt/``): what autograd keeps for the backward pass.

GPT only (``supports``): its terms are a GPT block's (LayerNorm, fused qkv, 4C GeLU MLP, learned positions). Other
families have no analytic model yet; their rows show "—" and the simulator (``pytest_flashckpt.simulate``), which
runs the real step on ``meta``, is the number to read. A GPT formula is never applied to another family's block.

Counted per token (multiply by batch * seq) in elements of the model dtype unless noted; C = width, a = heads,
T = sequence length, V = vocabulary. Derived op by op from the block (and checked against the exact ``cpu`` probe):

one block, no checkpointing           kept for backward
  ln_1(x)                             x (C), LayerNorm mean/rstd (2 fp32)
  c_attn                              ln_1 output (C)
  attention, fused kernel             q, k, v = views of c_attn's output (3C), output (C), logsumexp (a fp32)
  attention, math (eager; SDPA with   copies of q and k^T for the batched matmul (2C), softmax output (a*T),
    dropout on a CPU)                 copy of v (C), output copy read by c_proj (C); eager also keeps its T x T
                                      bool mask (per block, not per token)
  attn.c_proj (+ residual add)        reads the attention output (counted above); the add keeps nothing
  ln_2                                x1 = x + attn (C), mean/rstd (2 fp32)
  mlp.c_fc, GeLU, mlp.c_proj          ln_2 output (C), c_fc output (4C, GeLU input), GeLU output (4C)
  total                               16C (+ a*T for math attention), the same for both attention paths
dropout > 0 adds per block            2 residual-dropout masks (2C) and, with math attention, the attention
                                      dropout mask and the dropped probabilities (2*a*T). PyTorch's CPU dropout
                                      keeps its mask in the model dtype; CUDA's native_dropout keeps 1-byte masks.
                                      Fused kernels regenerate attention dropout from the RNG state (no mask).
full checkpointing                    only the block input (C)
selective_op (default policy)         x (C), c_attn output (3C), attention output (C) + logsumexp (fused) or
                                      scores (a*T) + output (C) (math), c_fc output (4C): 9C (+ a*T); each of
                                      attn.c_proj and mlp.c_proj not in DEFAULT_RECOMPUTE_ROLES keeps its output
                                      (+C), and listing save ops explicitly keeps both (+2C)
outside the blocks                    final block output and ln_f output (2C, + 2 fp32), log-softmax of the
                                      logits (V), embedding dropout mask (C, with dropout)

Korthikanti et al. count s*b*h*(34 + 5*a*s/h) bytes for a 16-bit block with dropout: 34 bytes = 16 elements x 2
bytes + 2 one-byte masks, and 5*a*s/h *h = 2-byte scores + 2-byte dropped scores + 1-byte mask per head: the
same terms as our math-attention row on a GPU. FlashAttention removes the a*T terms, hence "linear in T".

Peak of a training step. With the optimizer state resident and gradients freed after each step, the step peaks
either (a) at the loss backward: everything kept + two more B*T*V tensors (the gradient of the log-softmax and
of the logits) or (b) while the top checkpointed block is recomputed in the backward pass, when one block's
full activations exist again beside the gradients built so far, or (c) at the end of the backward pass, when
every parameter has a gradient and the embeddings' dense gradients are being accumulated. (a) is exact to the
byte against the ``cpu`` probe; (b) and (c) approximate the gradient tensors in flight, so where they dominate
(full checkpointing at short sequences, where little activation memory is left) the estimate is within ~12%.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.activation import options as _options
from pytest_flashckpt.activation.plan import plan_for
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.core.registry import ACTIVATION_STRATEGIES
from pytest_flashckpt.models.families import family_of
from pytest_flashckpt.models.gpt import GPTConfig

_FP32 = 4


def supports(config) -> bool:
    """Whether this analytic model knows ``config``'s blocks (the GPT family only)."""
    return family_of(config).analytic_bytes


def _require(config) -> None:
    if not supports(config):
        raise ValueError(
            f"the analytic activation model covers the GPT family only; model card {config.name!r} is "
            f"{config.family!r} (use pytest_flashckpt.simulate.simulate_step for its bytes)"
        )


@dataclass(frozen=True)
class Workload:
    """What activation memory depends on besides the model: batch, sequence, kernel, dtype, device."""

    batch_size: int
    seq_len: int
    backend: str = "sdpa"  # sdpa | eager | flash_attn
    dtype_bytes: int = 4
    device: str = "cpu"  # cpu | cuda: dropout masks are dtype-sized on a CPU, one byte on CUDA

    def math_attention(self, dropout: float) -> bool:
        """Whether attention materialises the T x T scores: eager always; SDPA on a CPU with dropout."""
        return self.backend == "eager" or (self.backend == "sdpa" and self.device == "cpu" and dropout > 0)

    def mask_bytes(self) -> int:
        return self.dtype_bytes if self.device == "cpu" else 1


@dataclass(frozen=True)
class ActivationEstimate:
    """Bytes autograd keeps after the forward (``kept_bytes``) and the estimated peak of a training step."""

    strategy: str
    block_bytes: tuple[int, ...]  # kept per block
    outside_bytes: int  # embeddings, final LayerNorm, log-softmax
    resident_bytes: int  # parameters, optimizer state, the batch
    peak_bytes: int

    @property
    def kept_bytes(self) -> int:
        return sum(self.block_bytes) + self.outside_bytes


def block_bytes(config: GPTConfig, work: Workload, mode: str, explicit_save_ops: bool = False) -> int:
    """Bytes one block keeps for backward; ``mode`` is ``none`` (plain), ``full`` (checkpointed) or
    ``selective_op``."""
    _require(config)
    C, a, T, d = config.width, config.num_heads, work.seq_len, work.dtype_bytes
    tokens = work.batch_size * T
    math_attn = work.math_attention(config.dropout)
    dropout = config.dropout > 0
    if mode == "full":
        return tokens * C * d
    if mode == "selective_op":
        elements = 9 * C + C * len(_UNREAD_OUTPUTS - set(() if explicit_save_ops else selective_recompute_roles()))
        elements += a * T if math_attn else 0
        return tokens * (elements * d + (0 if math_attn else a * _FP32))
    if mode != "none":
        raise ValueError(f"unknown block mode {mode!r}; valid: none, full, selective_op")
    per_token = 16 * C * d + 4 * _FP32
    if math_attn:
        per_token += a * T * d
        if dropout:
            per_token += a * T * (d + work.mask_bytes())
    else:
        per_token += a * _FP32  # logsumexp
    if dropout:
        per_token += 2 * C * work.mask_bytes()
    causal_mask = T * T if work.backend == "eager" else 0
    return tokens * per_token + causal_mask


# The projections whose outputs no GPT backward reads (the residual add after each saves nothing): selective_op
# keeps them only while it saves their matmuls
_UNREAD_OUTPUTS = {"o", "down"}


def selective_recompute_roles() -> tuple[str, ...]:
    """The roles selective_op's default recomputes, checked against what this model has terms for (a role whose
    output the backward reads would change the formula, not just drop a term)."""
    unknown = sorted(set(_options.DEFAULT_RECOMPUTE_ROLES) - _UNREAD_OUTPUTS)
    if unknown:
        raise ValueError(f"the analytic model has no selective_op term for recomputing role(s) {', '.join(unknown)}")
    return _options.DEFAULT_RECOMPUTE_ROLES


def outside_bytes(config: GPTConfig, work: Workload) -> int:
    """Bytes kept outside the blocks: final block output, ln_f output and stats, log-softmax, embedding dropout."""
    C, V, d = config.width, config.vocab_size, work.dtype_bytes
    per_token = 2 * C * d + 2 * _FP32 + V * d + (C * work.mask_bytes() if config.dropout > 0 else 0)
    return work.batch_size * work.seq_len * per_token


def resident_bytes(config: GPTConfig, work: Workload, optimizer_states: int = 2) -> int:
    """Parameters + AdamW's two moments (after the first step) + the int64 batch (inputs and targets)."""
    return config.num_params() * work.dtype_bytes * (1 + optimizer_states) + 2 * work.batch_size * work.seq_len * 8


# block option kind -> the analytic block mode it is kept in (offload keeps nothing on the accelerator)
_MODE_OF_KIND = {"none": "none", "full": "full", "by_op": "selective_op", "offload": "offload"}


def block_modes(strategy: str, n_blocks: int, k: int = 2) -> tuple[str, ...]:
    """How each block is kept under a strategy: its plan (``activation.plan.plan_for``), read as the modes this
    model has formulas for. Offload is modelled as on the GPU it needs. ``budget`` is a ValueError (its plans are
    chosen per input shape: no closed form), and so would be a strategy whose plan holds an option with no formula."""
    spec = ACTIVATION_STRATEGIES.get(strategy)
    if spec is not None and spec.takes_budget:
        raise ValueError(f"the analytic model has no formula for strategy {strategy!r}: its plans are chosen per input "
                         "shape from measured costs (read the plan's predicted peak instead)")
    modes = []
    for option in plan_for(ActivationConfig(strategy=strategy, k=k, budget=None), n_blocks, device_type="cuda"):
        if option.kind not in _MODE_OF_KIND:
            raise ValueError(f"the analytic model has no formula for block option {option.name!r} (strategy {strategy!r})")
        modes.append(_MODE_OF_KIND[option.kind])
    return tuple(modes)


def estimate(config: GPTConfig, work: Workload, strategy: str = "none", k: int = 2, explicit_save_ops: bool = False) -> ActivationEstimate:
    """Kept bytes per block and outside, and the step's estimated peak (see the module docstring)."""
    _require(config)
    modes = block_modes(strategy, config.num_blocks, k)
    kept = tuple(0 if m == "offload" else block_bytes(config, work, m, explicit_save_ops) for m in modes)
    outside = outside_bytes(config, work)
    resident = resident_bytes(config, work)
    tokens = work.batch_size * work.seq_len
    loss_backward = sum(kept) + outside + 2 * tokens * config.vocab_size * work.dtype_bytes
    # (c) the end of the backward pass: every parameter gradient plus the embeddings' dense gradient temporaries
    end_of_backward = (config.num_params() + (config.vocab_size + config.max_seq_len) * config.width + 2 * tokens * config.width) * work.dtype_bytes
    peak = max(loss_backward, _recompute_peak(config, work, modes, kept), end_of_backward)
    return ActivationEstimate(strategy, kept, outside, resident, resident + peak)


def saving(config: GPTConfig, work: Workload, strategy: str, k: int = 2) -> float:
    """Estimated memory saving of ``strategy``: 1 - peak(strategy) / peak(none), resident state included."""
    return 1 - estimate(config, work, strategy, k).peak_bytes / estimate(config, work, "none").peak_bytes


def _recompute_peak(config: GPTConfig, work: Workload, modes: tuple[str, ...], kept: tuple[int, ...]) -> int:
    """Moment (b): the top checkpointed block replayed in the backward pass. Its plain activations exist again
    beside the blocks below it, the gradient of its output and the parameter gradients built so far; with math
    attention the backward later peaks inside attention, after the MLP's tensors (9C, + its dropout mask) are
    freed and the two a*T score gradients are alive. Lower blocks replay with fewer activations alive below
    them, which on our shapes outweighs the extra gradients, so only the top one is estimated."""
    replayed_blocks = [i for i, mode in enumerate(modes) if mode in ("full", "selective_op")]
    if not replayed_blocks:
        return 0
    top = replayed_blocks[-1]
    C, d = config.width, work.dtype_bytes
    tokens = work.batch_size * work.seq_len
    block_params = (config.num_params() - (config.vocab_size + config.max_seq_len) * C) // config.num_blocks
    grads_above = ((config.num_blocks - 1 - top) * block_params + config.vocab_size * C) * d
    replayed = sum(kept[:top]) + block_bytes(config, work, "none") + grads_above
    peak = replayed + tokens * C * d
    if work.math_attention(config.dropout):
        mlp = tokens * (9 * C * d + (C * work.mask_bytes() if config.dropout > 0 else 0))
        score_grads = 2 * tokens * config.num_heads * work.seq_len * d
        mlp_param_grads = (8 * C * C + 5 * C) * d
        peak = max(peak, replayed - mlp + score_grads + 2 * tokens * C * d + mlp_param_grads)
    return peak


def korthikanti_llama_block_bytes(config, batch: int, seq: int) -> int:
    """Korthikanti et al.'s arithmetic on a Llama block (16-bit, no dropout, a flash kernel: no s x s terms): 2 bytes
    for every value a backward reads, per token: both norms' inputs (2 x h), the q/k/v projections' input (h), q
    and k (h + kv), v (kv), o's input (h), the MLP's input (h), and SwiGLU's gate, SiLU, up and product (4 x i)."""
    h, kv, i = config.n_embd, config.kv_dim, config.intermediate_size
    return 2 * seq * batch * (6 * h + 2 * kv + 4 * i)


def korthikanti_llama_terms(config, batch: int, seq: int, norm: str) -> dict[str, int]:
    """The exact terms from ``korthikanti_llama_block_bytes`` to a simulated bf16 Llama block on CUDA's flash
    kernel (``simulate_step``'s ``block_kept_bytes``): the arithmetic leaves out the kernels' float32 statistics,
    and Hugging Face's plain RMSNorm keeps a float32 copy of its input and its unweighted output (4 + 2 bytes a
    value) where the arithmetic counts its 2-byte input; the fused norm keeps that input."""
    tokens = seq * batch
    terms = {"korthikanti (Llama block)": korthikanti_llama_block_bytes(config, batch, seq),
             "flash logsumexp (fp32 per head)": 4 * config.n_head * tokens,
             "RMSNorm rstd (2 x fp32)": 2 * 4 * tokens,
             "flash RNG seed/offset on meta": 24}
    if norm == "plain":
        terms["plain RMSNorm: fp32 input copy + unweighted output, not the input (2 x (4 + 2 - 2) bytes)"] = 2 * 4 * config.n_embd * tokens
    return terms
