"""What saving a layout's training state costs, and how often to save it.

A sharded save is torch's DCP (``torch.distributed.checkpoint``, what ``distributed.sharded_store`` writes): every
rank of one ``dp_shard x tp x pp`` group writes its own shards to one file (``FileSystemWriter``'s default, one
``__<rank>_0.distcp`` per rank) and the coordinator adds ``.metadata``; HSDP replicas hold the same shards and DCP's
planner deduplicates them, spreading each duplicated item over the ranks that hold it (``dedup_save_plans``), so
every rank writes ``1 / dp_replicate`` of its shards. The bytes a rank writes are its parameters and both AdamW
moments (no gradients): the rank's state as simulated (the forward+backward window's start) when the layout was
simulated, else ``SAVED_BYTES_PER_PARAM`` over the even split.

- **host RAM for async staging per node**: ``dcp.async_save`` copies the state dict to CPU memory before writing in
  the background: the bytes of the writing ranks of one node.
- **save time** at a stated storage bandwidth per node (``--storage-gbps``, GB/s written per node; default 2, an
  assumption, say yours): a node's bytes / that bandwidth (nodes write in parallel).
- **the interval** that minimises the expected lost work for a job MTBF ``M`` and a save of ``C`` seconds: Young's
  first-order optimum ``sqrt(2 C M)`` (J. W. Young, "A first order approximation to the optimum checkpoint
  interval", Communications of the ACM 17(9), 1974; Daly's higher-order estimate, J. T. Daly, "A higher order
  estimate of the optimum checkpoint interval for restart dumps", Future Generation Computer Systems 22(3), 2006,
  agrees with it while ``C << M``), with the expected fraction of time lost ``C / tau + tau / (2 M)``.
- **the MTBF**: ``--mtbf-hours`` (the job's), or, unset, Llama 3's measured rate scaled to the GPU count: 419
  unexpected interruptions in a 54-day snapshot on 16,384 H100s ("The Llama 3 Herd of Models", 2024, section
  3.3.4), i.e. one per ``54 x 24 x 16384 / 419`` GPU-hours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_flashckpt.fit.assumptions import DEFAULT_STORAGE_GBPS
from pytest_flashckpt.fit.candidates import SAVED_BYTES_PER_PARAM, Candidate

LLAMA3_GPU_HOURS_PER_INTERRUPTION = 54 * 24 * 16384 / 419


@dataclass(frozen=True)
class CheckpointCost:
    bytes_per_rank: int
    files_per_rank: int
    writing_ranks: int
    metadata_files: int
    staging_bytes_per_node: int
    save_s: float
    mtbf_s: float
    interval_s: float  # Young: sqrt(2 C M)
    lost_fraction: float  # C / tau + tau / (2 M)

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_rank * self.writing_ranks


def job_mtbf_hours(gpus: int, mtbf_hours: float | None = None) -> float:
    return mtbf_hours if mtbf_hours is not None else LLAMA3_GPU_HOURS_PER_INTERRUPTION / gpus


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young's optimum interval between saves (see the module doc)."""
    return math.sqrt(2 * save_s * mtbf_s)


def lost_fraction(save_s: float, interval_s: float, mtbf_s: float) -> float:
    """Expected fraction of time lost: the saves themselves plus half an interval of work per failure."""
    return save_s / interval_s + interval_s / (2 * mtbf_s)


def checkpoint_cost(parameters: int, candidate: Candidate, gpus_per_node: int, *, state_bytes: int | None = None,
                    storage_gbps: float = DEFAULT_STORAGE_GBPS, mtbf_hours: float | None = None) -> CheckpointCost:
    """The cost of one DCP save of ``candidate`` (see the module doc); ``state_bytes``: the simulated rank's state."""
    group = candidate.dp_shard * candidate.cp * candidate.tp * candidate.pp  # FSDP2 shards over dp_shard x cp
    shards = state_bytes if state_bytes is not None else -(-parameters // group) * SAVED_BYTES_PER_PARAM[candidate.precision]
    per_rank = -(-shards // candidate.dp_replicate)
    node_bytes = per_rank * min(gpus_per_node, candidate.gpus)
    save_s = node_bytes / (storage_gbps * 1e9)
    mtbf_s = job_mtbf_hours(candidate.gpus, mtbf_hours) * 3600
    interval = young_interval_s(save_s, mtbf_s)
    return CheckpointCost(per_rank, 1, candidate.gpus, 1, node_bytes, save_s, mtbf_s, interval,
                          lost_fraction(save_s, interval, mtbf_s))
