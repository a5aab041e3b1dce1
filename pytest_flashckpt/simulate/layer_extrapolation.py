"""A deep card's rank from the same card at a few depths: the blocks of every family here are identical, so each
window's start (the state: parameters, gradients, AdamW's moments, a fixed amount per block) and its peak (from the
depth on where the same moment of the step peaks, e.g. the start of the backward, with every block's kept
activations alive) grow by the same bytes per block. Simulated at depths ``d, d + s, d + 2s`` (``s``: the plan's
period, ``k`` for ``every_k``, else 1; ``d`` at least ``FIRST_DEPTH`` and ``2s``, of the card's depth modulo ``s``,
so the last block's option is the card's), a record whose every byte count steps by the same amount both times is extended to the card's depth; one
that does not is not extrapolated (the caller slides the window deeper, then simulates the card whole).

Collinear points are the condition, not a proof: a peak that moves to another moment at a depth beyond the samples
would bend the line there. ``tests/simulate/test_layer_extrapolation.py`` checks the extrapolated record against
the whole card's simulation to the byte on cards where both run (strategies none, full, every_k; tp 1 and 2; pure
and mixed precision), and the smallest depth sampled (``FIRST_DEPTH``) is past the shallow depths where the
measured peaks were not yet on their line (Llama-3-70B FSDP-8 with full checkpointing: depth 2's peak is off).
"""

from __future__ import annotations

from collections.abc import Mapping

LINEAR_KEYS = ("fwd_bwd_start_bytes", "fwd_bwd_peak_bytes", "optimizer_start_bytes", "optimizer_peak_bytes",
               "largest_allgather_bytes")
FIRST_DEPTH = 3  # the shallowest depth sampled (see the module docstring)
POINTS = 3  # depths per line: two steps, the second the check of the first
MAX_SAMPLES = 5  # depths simulated before giving up on a line (the window slides deeper after a bent one)


def period(strategy: str, k: int) -> int:
    """Blocks after which the activation plan repeats: ``k`` for every_k (blocks 0, k, 2k, ... checkpointed)."""
    return k if strategy == "every_k" else 1


def sample_depths(n_layer: int, strategy: str, k: int, stages: int = 1, first: int = FIRST_DEPTH) -> list[int]:
    """The depths to simulate, shallowest first (up to ``MAX_SAMPLES``), each below ``n_layer`` and of its residue
    modulo the plan's period; fewer than ``POINTS`` means: simulate the card whole.

    ``stages`` (pipeline stages, ``simulate.pipeline``): each step adds the plan's period of blocks to every stage and
    keeps ``n_layer % stages`` (which stages hold one block more), so every stage's blocks and plan are those of the
    card at ``b`` blocks per stage; ``first`` is then the fewest blocks per stage sampled."""
    step = period(strategy, k)
    per_stage, extra = divmod(n_layer, stages)
    lowest = max(first, 2 * step if step > 1 else first)  # (every_k, k 2: depths 3, 5, 7 bend where 5, 7, 9 hold)
    lowest += (per_stage - lowest) % step
    depths = [stages * b + extra for b in range(lowest, per_stage, step)][:MAX_SAMPLES]
    return depths if len(depths) >= POINTS else []


def line_through(records: Mapping[int, Mapping[str, int]], n_layer: int,
                 keys: tuple[str, ...] = LINEAR_KEYS) -> dict[str, int] | None:
    """The byte counts at depth ``n_layer`` on the line through the last ``POINTS`` records (depth -> record,
    equally spaced), or None when any byte count does not step by the same amount at every step."""
    depths = sorted(records)[-POINTS:]
    if len(depths) < POINTS:
        return None
    spacing = depths[1] - depths[0]
    if any(b - a != spacing for a, b in zip(depths, depths[1:])) or (n_layer - depths[-1]) % spacing:
        return None
    out: dict[str, int] = {}
    for key in keys:
        values = [records[d][key] for d in depths]
        steps = {b - a for a, b in zip(values, values[1:])}
        if len(steps) != 1:
            return None
        out[key] = values[-1] + steps.pop() * ((n_layer - depths[-1]) // spacing)
    out["peak_bytes"] = max(out["fwd_bwd_peak_bytes"], out["optimizer_peak_bytes"])
    return out
