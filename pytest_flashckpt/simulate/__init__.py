"""Will it fit? The exact peak memory of a real training step, simulated on the ``meta`` device.

    from pytest_flashckpt.simulate import simulate_step
    peak = simulate_step("gpt3-2.7b", "bf16", batch_size=8, seq_len=2048, kernel="flash", strategy="full")

See README "Will it fit?" for what is exact, what is not, and how it was validated against real CPU runs.
Exports are loaded lazily so that ``flashckpt`` (which lists this command) does not import torch to start.
"""

__all__ = ["SimulatedPeak", "check_workload", "dtype_name", "simulate_step"]


def __getattr__(name: str):
    if name == "SimulatedPeak":
        from pytest_flashckpt.simulate.result import SimulatedPeak

        return SimulatedPeak
    if name == "simulate_step":
        from pytest_flashckpt.simulate.step import simulate_step

        return simulate_step
    if name in ("check_workload", "dtype_name"):
        from pytest_flashckpt.simulate import workload

        return getattr(workload, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
