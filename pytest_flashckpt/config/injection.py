"""Known regressions injected on purpose, to check that the gate can fail (``--flashckpt-inject``, and
``benchmarks/gate_power.py``). Never for a real measurement: the report and the terminal say when one was on.

- ``step=F``: every step of the scenario's strategy (never its reference) takes F longer: after the step, the
  loop sleeps F x the step's own duration, so the slowdown is F of the step whatever else runs on the machine
  (a fixed extra would shrink as a share of the step when the machine is slowed by other work).
- ``jitter=J``: each step sleeps a further uniform random share in [0, J) of its duration (seeded): a slowdown that
  also widens the scatter, as a real regression on a noisy path can.
- ``stall=F``: every save of the strategy blocks the training loop F longer (a sleep inside the save's blocking
  part, counted in ``save_stall_s``); the reference's saves are untouched.

Text form: ``step=0.10``, ``stall=0.25``, ``step=0.10,jitter=0.3,seed=1``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, fields
from typing import Callable


@dataclass(frozen=True)
class Injection:
    step: float = 0.0
    jitter: float = 0.0
    stall: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("step", "jitter", "stall"):
            if not 0.0 <= getattr(self, name) <= 10.0:
                raise ValueError(f"{name}={getattr(self, name)} must be a fraction in [0, 10]")

    @classmethod
    def parse(cls, text: str) -> "Injection | None":
        """``"step=0.1,stall=0.25"`` -> Injection; ``""`` -> None. A bad key or value is a ValueError naming it."""
        text = text.strip()
        if not text:
            return None
        names = {f.name: f.type for f in fields(cls)}
        values: dict[str, float | int] = {}
        for part in text.split(","):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or key not in names:
                raise ValueError(f"{part!r} is not KEY=VALUE with KEY one of {', '.join(names)}")
            try:
                values[key] = int(raw) if key == "seed" else float(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r} is not a number") from None
        injection = cls(**values)  # type: ignore[arg-type]
        return injection if injection.active else None

    @property
    def active(self) -> bool:
        return bool(self.step or self.jitter or self.stall)

    def describe(self) -> str:
        parts = [f"step +{self.step:.0%}" if self.step else "", f"step jitter up to +{self.jitter:.0%}" if self.jitter else "",
                 f"save stall +{self.stall:.0%}" if self.stall else ""]
        return "injected regression: " + ", ".join(p for p in parts if p)

    def slow_step(self, step: Callable[[], object]) -> Callable[[], object]:
        """``step`` followed by a sleep of (step + U[0, jitter)) x its own duration."""
        if not (self.step or self.jitter):
            return step
        rng = random.Random(self.seed)

        def slowed():
            begin = time.perf_counter()
            out = step()
            share = self.step + (rng.uniform(0.0, self.jitter) if self.jitter else 0.0)
            time.sleep(share * (time.perf_counter() - begin))
            return out

        return slowed
