"""A parallel layout: how the ranks of a run split the work (issue 32).

``Layout(dp_shard, tp, pp=1, cp=1)``: ``dp_shard`` ranks shard parameters, gradients and optimizer state with FSDP2
and split the batch; ``tp`` ranks split every block's matmuls (tensor parallel, with sequence parallel on the
norms); ``pp`` (pipeline stages) and ``cp`` (context parallel) are named here so a request for them is refused
with a clear error: this step builds dp_shard x tp only (docs/layouts.md). The world is the product of the axes.

The checks are the ones a layout request can fail before anything runs: every axis a positive integer, the world
equal to the product, the attention heads (query and key/value) divisible by ``tp`` (a column shard of q/k/v must
hold whole heads), the batch divisible by ``dp_shard`` (every data-parallel rank reads an equal share). They raise
``ValueError`` naming the axis and the fix; callers place it (``ConfigError.within``, the CLI's ``InputError``).
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("dp_shard", "tp", "pp", "cp")


@dataclass(frozen=True)
class Layout:
    """Ranks per axis; ``world_size`` is their product. Mesh dimension order: ("dp_shard", "tp") as torchtitan."""

    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"layout {axis} must be a positive integer, got {value!r}")
        for axis in ("pp", "cp"):
            if getattr(self, axis) != 1:
                raise ValueError(
                    f"layout {axis}={getattr(self, axis)}: pipeline and context parallel are not built yet "
                    f"(dp_shard x tp only; see docs/layouts.md); use {axis}=1"
                )

    @property
    def world_size(self) -> int:
        return self.dp_shard * self.tp * self.pp * self.cp

    @property
    def is_2d(self) -> bool:
        return self.dp_shard > 1 and self.tp > 1

    @classmethod
    def for_world(cls, world_size: int, tp: int = 1) -> "Layout":
        """The layout of ``world_size`` ranks with ``tp``-way tensor parallel and FSDP over the rest."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be a positive integer, got {tp!r}")
        if world_size % tp:
            raise ValueError(f"world size {world_size} is not divisible by tp {tp}; choose a tp that divides it")
        return cls(dp_shard=world_size // tp, tp=tp)

    def check_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ValueError(
                f"layout dp_shard {self.dp_shard} x tp {self.tp} needs {self.world_size} ranks, the run has "
                f"{world_size}; make dp_shard x tp equal the world size"
            )

    def check_card(self, card) -> None:
        """The model card can be split ``tp`` ways: whole query and key/value heads on every rank."""
        if self.tp == 1:
            return
        heads = {"n_head": card.n_head, "n_kv_head": getattr(card, "n_kv_head", card.n_head)}
        for key, count in heads.items():
            if count % self.tp:
                raise ValueError(
                    f"layout tp {self.tp}: model card {card.name!r} has {key} {count}, not divisible by tp; "
                    f"choose a tp that divides {count}"
                )

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.dp_shard:
            raise ValueError(
                f"batch {batch_size} is not divisible by dp_shard {self.dp_shard}; each data-parallel rank needs "
                "an equal share"
            )

    def describe(self) -> str:
        return f"dp_shard {self.dp_shard} x tp {self.tp}"
