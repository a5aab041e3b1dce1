"""A step's time on a layout: compute at an assumed fraction of the device's peak, the communication that is
exposed, the optimizer's memory traffic and the pipeline bubble. A model to rank layouts, not a measurement.

Per microbatch on one rank (``B`` sequences of ``T`` tokens, width ``C``):

- **compute**: the step's matmul FLOPs from the project's closed form (``activation.expected_flops``: the family's
  block, attention at the fused kernel's cost, the head, and what the strategy's plan replays in the backward pass),
  divided by ``tp`` (tensor parallel splits every matmul, attention by heads, the head by vocabulary), at
  ``peak x mfu``. ``mfu`` is an assumption (default 0.5: torchtitan's published Llama 3 FSDP runs report 50-58 %
  MFU on A100, docs/performance.md), overridable with ``--mfu``.
- **tensor parallel** (on the critical path, never overlapped: torch's TP without async-TP waits on each): per block
  2 all-gathers and 2 reduce-scatters of the ``B x T x C`` activations in the forward (sequence parallel around
  attention and the MLP), as many in the backward, and the forward's again for a block the plan replays whole (the
  all-gathers alone for a selective replay, which saves the matmul outputs and re-runs the rest), plus the
  embedding's and the head's; each a ring over ``tp`` GPUs: ``(tp-1)/tp x bytes / link`` plus its latency (a base
  per call and one per hop, ``fit.hardware``).
- **FSDP**: every block's parameters all-gathered in the forward and again in the backward (once with
  ``reshard_after_forward=False``), the gradients reduce-scattered (float32 under mixed precision), one call per
  block, each a ring over ``dp_shard``; HSDP adds an all-reduce of the gradient shard over the replicas. FSDP2 prefetches and overlaps
  them with compute, so only what exceeds the microbatch's compute is exposed.
- **optimizer**: AdamW reads the parameter, gradient and both moments and writes three of them: ``7 x`` the local
  state dtype's bytes per local parameter at HBM bandwidth.
- **pipeline stages** (``pp > 1``): a rank computes its ``1 / pp`` of the blocks for each of the schedule's
  microbatches (the candidate's ``accumulation``); the bubble adds ``(pp - 1) / (microbatches x virtual stages)`` of
  that time (1F1B and GPipe; interleaved with ``virtual`` stages per rank: Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 2.2); each microbatch sends its
  activations to the next stage and receives their gradient back (``virtual`` times over for interleaving), on the
  critical path, over the link the pipeline spans (``pp`` is the outermost mesh dimension). FSDP2 inside a stage
  keeps the gathered blocks over the microbatches and reduce-scatters once (``distributed.pipeline``): its
  all-gathers and reduce-scatters are per step, overlapped with the step's compute.

- **context parallel** (``cp > 1``, modelled as ``simulate.context_parallel`` runs torch's ring with its default
  all-gather rotation): per block, the forward all-gathers the other ranks' keys and values, the backward
  all-gathers them again and exchanges their float32 gradients (twice the bytes), a replayed block gathers once
  more; on the critical path (torch's all-gather rotation does not overlap them), over the link the cp group spans
  (cp inside the node after tp). Compute is divided by ``cp`` (each rank's share of the tokens: attention's
  causal work is balanced by the load-balanced ring).

A link is NVLink when the group's GPUs are in one node, the network adapter once it spans nodes (``fit.hardware``).
Ranks are laid out torchtitan's way: ``tp`` innermost, then ``dp_shard``, then replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.activation.expected_flops import expected_matmul_flops
from pytest_flashckpt.activation.plan import plan_for
from pytest_flashckpt.config.scenario import ActivationConfig
from pytest_flashckpt.fit.assumptions import DEFAULT_MFU
from pytest_flashckpt.fit.candidates import COMPUTE_BYTES, Candidate
from pytest_flashckpt.fit.hardware import Device

# per block: forward all-gathers + reduce-scatters, backward as many; a replayed block's forward again
TP_COLLECTIVES_PER_BLOCK = {"forward": 4, "backward": 4, "replay_full": 4, "replay_selective": 2}
TP_COLLECTIVES_OUTSIDE_BLOCKS = 4  # embedding reduce-scatter and head all-gather, forward and backward
GRADIENT_BYTES = {"pure": 2, "mixed": 4}  # FSDP2's reduce dtype
OPTIMIZER_STATE_BYTES = {"pure": 2, "mixed": 4}
ADAMW_TOUCHES = 7  # reads parameter, gradient, exp_avg, exp_avg_sq; writes parameter, exp_avg, exp_avg_sq


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step of a candidate, by part (see the module doc)."""

    compute_s: float
    tp_s: float  # tensor parallel's collectives, a pipeline's sends and the context-parallel ring: the critical path
    fsdp_s: float  # total FSDP communication
    fsdp_exposed_s: float
    optimizer_s: float
    bubble_fraction: float
    step_s: float
    tokens_per_s_per_gpu: float
    model_flops: int  # the step's FLOPs without recomputation, all ranks (what MFU counts)
    mfu: float  # model FLOPs / (step time x GPUs x peak): comparable with torchtitan's MFU


def ring_s(nbytes: float, ranks: int, link_bytes_per_s: float, hop_latency_s: float = 0.0, base_latency_s: float = 0.0,
           calls: int = 1) -> float:
    """``calls`` ring all-gathers or reduce-scatters of ``nbytes`` in all (whole tensors) over ``ranks``: each rank
    moves ``(ranks - 1) / ranks`` of the bytes through its link, and each call pays a base latency and one per hop
    (``ranks - 1`` hops)."""
    if ranks <= 1:
        return 0.0
    return calls * (base_latency_s + (ranks - 1) * hop_latency_s) + (ranks - 1) / ranks * nbytes / link_bytes_per_s


def pipeline_bubble_fraction(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """The 1F1B (or interleaved) bubble as a fraction of the pipelined time (see the module doc)."""
    return (pp - 1) / (microbatches * virtual_stages)


def tp_collectives(n_blocks: int, replays: int, selective_replays: int) -> int:
    per = TP_COLLECTIVES_PER_BLOCK
    return (n_blocks * (per["forward"] + per["backward"]) + replays * per["replay_full"]
            + selective_replays * per["replay_selective"] + TP_COLLECTIVES_OUTSIDE_BLOCKS)


def replay_counts(candidate: Candidate, n_blocks: int) -> tuple[int, int]:
    """(blocks replayed whole, blocks replayed selectively) under the candidate's strategy, read off its registered
    plan (``activation.plan.plan_for``) as the FLOP closed form reads it: a ``full`` block re-runs its forward, a
    ``by_op`` or ``by_role`` block re-runs what it does not save, ``none`` and ``offload`` nothing."""
    options = plan_for(ActivationConfig(strategy=candidate.strategy, k=candidate.k), n_blocks, device_type="cuda")
    return (sum(o.kind == "full" for o in options), sum(o.kind in ("by_op", "by_role") for o in options))


class StepTimeModel:
    """Step times of one card at one sequence length on one device (FLOPs per sequence cached per strategy)."""

    def __init__(self, card, seq_len: int, device: Device, mfu: float = DEFAULT_MFU) -> None:
        if not 0 < mfu <= 1:
            raise ValueError(f"mfu {mfu}: expected a fraction in (0, 1]")
        self.card, self.seq_len, self.device, self.mfu = card, seq_len, device, mfu
        self._flops: dict[tuple[str, int], int] = {}

    def flops_per_sequence(self, strategy: str, k: int) -> int:
        """The closed form at batch 1 (every term is linear in the batch)."""
        if (strategy, k) not in self._flops:
            self._flops[(strategy, k)] = expected_matmul_flops(self.card, 1, self.seq_len, strategy, k)
        return self._flops[(strategy, k)]

    def step(self, c: Candidate) -> StepTime:
        card, device, T = self.card, self.device, self.seq_len
        compute = (self.flops_per_sequence(c.strategy, c.k) * c.microbatch / (c.tp * c.cp * c.pp)
                   / (device.peak_flops * self.mfu))
        n_blocks = card.num_blocks
        replays, selective = replay_counts(c, n_blocks)
        activation = c.microbatch * T * card.n_embd * COMPUTE_BYTES / c.cp
        n_tp = tp_collectives(n_blocks // c.pp, replays // c.pp, selective // c.pp)
        tp = ring_s(n_tp * activation, c.tp, device.link_bytes_per_s(c.tp), device.hop_latency_s(c.tp),
                    device.collective_latency_s, calls=n_tp)
        local_params = card.num_params() / (c.tp * c.pp)
        gathers = 2 if c.reshard_after_forward else 1
        shard_span = c.dp_shard * c.tp * c.cp  # (cp inside a replica: its ranks are consecutive)
        groups = n_blocks // c.pp + 1  # FSDP2 gathers and reduces one block (and the root's rest) per call

        def dp_ring(nbytes: float, ranks: int, span: int, calls: int) -> float:
            return ring_s(nbytes, ranks, device.link_bytes_per_s(span), device.hop_latency_s(span),
                          device.collective_latency_s, calls=calls)

        fsdp = (dp_ring(gathers * local_params * COMPUTE_BYTES, c.dp_shard, shard_span, gathers * groups)
                + dp_ring(local_params * GRADIENT_BYTES[c.precision], c.dp_shard, shard_span, groups))
        if c.dp_replicate > 1:  # all-reduce = reduce-scatter + all-gather of the gradient shard across replicas
            shard = local_params / c.dp_shard * GRADIENT_BYTES[c.precision]
            fsdp += dp_ring(2 * shard, c.dp_replicate, shard_span * c.dp_replicate, 2 * groups)
        optimizer = ADAMW_TOUCHES * local_params / c.dp_shard * OPTIMIZER_STATE_BYTES[c.precision] / device.hbm_bytes_per_s
        if c.cp > 1:
            kv = 2 * c.microbatch * T * card.n_kv_head * (card.n_embd // card.n_head) * COMPUTE_BYTES / c.cp
            moves = (n_blocks * (1 + 1 + 2) + replays) // c.pp  # forward, backward, float32 K/V gradients, replays
            tp += ring_s(moves * c.cp * kv, c.cp, device.link_bytes_per_s(c.cp * c.tp), device.hop_latency_s(c.cp * c.tp),
                         device.collective_latency_s, calls=(3 * n_blocks + replays) // c.pp)
        if c.pp == 1:
            exposed = max(0.0, fsdp - compute)
            bubble = 0.0
            step = c.accumulation * (compute + tp + exposed) + optimizer
        else:  # fsdp: once per step (gathered over the microbatches); exposed per microbatch for the table's columns
            bubble = pipeline_bubble_fraction(c.pp, c.accumulation, c.stages_per_rank)
            sends = 2 * c.stages_per_rank  # per microbatch: activations forward, their gradient back, per stage held
            tp += sends * (device.collective_latency_s + device.hop_latency_s(c.gpus)
                           + activation / device.link_bytes_per_s(c.gpus))  # on the critical path, as TP's
            exposed = max(0.0, fsdp - c.accumulation * compute) / c.accumulation
            fsdp /= c.accumulation
            step = c.accumulation * (compute + tp) * (1 + bubble) + c.accumulation * exposed + optimizer
        tokens = c.dp * c.microbatch * c.accumulation * T
        model_flops = self.flops_per_sequence("none", c.k) * c.dp * c.microbatch * c.accumulation
        return StepTime(compute * c.accumulation, tp * c.accumulation, fsdp * c.accumulation, exposed * c.accumulation,
                        optimizer, bubble, step, tokens / step / c.gpus, model_flops,
                        model_flops / (step * c.gpus * device.peak_flops))
