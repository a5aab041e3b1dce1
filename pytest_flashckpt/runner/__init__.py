"""Running scenarios: the runners behind one interface (``runners``: in process, distributed, simulated), the
measurement passes (memory, interleaved timing, FLOPs, checkpoint) and the Result they produce, and a suite run
(``suite.SuiteRun``) that the pytest plugin and ``flashckpt run`` share. See docs/architecture.md."""
