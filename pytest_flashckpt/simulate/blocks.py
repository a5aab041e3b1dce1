"""Per-block activation bytes for each strategy, for a planner that mixes strategies block by block (budget).

``kept_per_block`` simulates the step once per strategy and returns what each block keeps for the backward pass
(``SimulatedPeak.block_kept_bytes``), plus the peak of each uniform strategy; the numbers are the simulator's,
so they carry its exactness (tests/simulate).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_flashckpt.simulate.result import SimulatedPeak
from pytest_flashckpt.simulate.step import simulate_step

UNIFORM_STRATEGIES = ("none", "full", "selective_op")


@dataclass(frozen=True)
class BlockCosts:
    """``kept[strategy][i]``: bytes block ``i`` keeps under ``strategy``; ``peaks[strategy]``: the whole step's
    simulated peak with that strategy on every block; ``outside``: bytes kept outside the blocks."""

    kept: dict[str, tuple[int, ...]]
    peaks: dict[str, SimulatedPeak]
    outside: int


def kept_per_block(card, dtype="bfloat16", batch_size=8, seq_len=2048, kernel="flash", target="cuda",
                   world_size=1, strategies=UNIFORM_STRATEGIES) -> BlockCosts:
    peaks = {s: simulate_step(card, dtype, batch_size, seq_len, kernel, s, target=target, world_size=world_size) for s in strategies}
    first = next(iter(peaks.values()))
    return BlockCosts({s: p.block_kept_bytes for s, p in peaks.items()}, peaks, first.outside_kept_bytes)
