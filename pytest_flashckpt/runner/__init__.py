"""Running scenarios: the measurement passes (memory, interleaved timing, FLOPs, checkpoint) and the Result they produce."""
