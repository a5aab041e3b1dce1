"""Will it fit? The exact peak memory of a real training step, simulated on the ``meta`` device.

    from pytest_flashckpt.simulate import simulate_step
    peak = simulate_step("gpt3-2.7b", "bf16", batch_size=8, seq_len=2048, kernel="flash", strategy="full")

See README "Will it fit?" for what is exact, what is not, and how it was validated against real CPU runs.
"""

from pytest_flashckpt.simulate.result import SimulatedPeak
from pytest_flashckpt.simulate.step import check_workload, dtype_name, simulate_step

__all__ = ["SimulatedPeak", "check_workload", "dtype_name", "simulate_step"]
