"""Running scenarios: the measurement passes (memory, interleaved timing, FLOPs, checkpoint) and the Result they produce;
a suite run without pytest (``suite.run_suite``). See docs/architecture.md."""
