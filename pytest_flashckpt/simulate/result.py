"""What a simulated step returns: the peak, its breakdown and the op at the peak, plus fits / headroom."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SimulatedPeak:
    """The exact peak of one simulated training step (bytes of live tensor storages, no allocator rounding).

    ``breakdown`` splits ``peak_bytes`` into parameters, gradients, optimizer_state, activations, temporaries
    (see ``simulate.probe``); ``block_kept_bytes`` is what each block keeps for backward after the forward pass
    (the budget planner's input), ``outside_kept_bytes`` what the embeddings, final LayerNorm and loss keep.
    ``host_bytes`` are CPU-side AdamW step counters: counted in a ``cpu`` prediction (a CPU run's probe sees
    them), not in a ``cuda`` one (they live in host memory there)."""

    card: str
    dtype: str
    batch_size: int
    seq_len: int
    kernel: str  # the backend the step ran (sdpa-flash, sdpa-flash-cpu, eager, ...)
    strategy: str
    target: str  # cuda | cpu: the device whose run this predicts
    peak_bytes: int
    start_bytes: int  # resident when the step starts: parameters, optimizer state
    end_bytes: int  # alive after the step (== start_bytes: every storage the step made was freed)
    breakdown: dict[str, int]
    peak_op: str
    peak_phase: str  # forward | backward | optimizer
    block_kept_bytes: tuple[int, ...]
    outside_kept_bytes: int
    host_bytes: int = 0
    world_size: int = 1
    sharding: dict[str, int] = field(default_factory=dict)  # FSDP: what the per-rank numbers replaced
    seconds: float = 0.0
    plan: dict = field(default_factory=dict)  # strategy budget: the plan (ShapePlan.to_dict, plan_s, describe)
    precision: str = "pure"  # pure: everything in dtype; mixed: float32 master state, compute autocast to dtype

    def headroom(self, device_bytes: int) -> int:
        """Bytes left on a device of ``device_bytes`` (negative: does not fit)."""
        return device_bytes - self.peak_bytes

    def fits(self, device_bytes: int) -> bool:
        return self.peak_bytes <= device_bytes

    def to_dict(self) -> dict:
        out = asdict(self)
        out["block_kept_bytes"] = list(self.block_kept_bytes)
        return out
