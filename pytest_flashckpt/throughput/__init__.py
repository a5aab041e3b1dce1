"""How close a step is to the machine's limit: tokens/s, achieved FLOP/s, MFU and HFU.

- ``peaks``: dense datasheet peaks per GPU and precision, each with its source (``device_peaks.yaml``), matched by
  the exact device name; anything else (a CPU, an unknown name, a precision the datasheet lacks) is refused with
  the reason, never guessed;
- ``roofline``: the measured matmul roofline, the best GEMM FLOP/s at the step's own matmul shapes and dtype;
- ``mfu``: a scenario's throughput metrics from its step time and two FLOP counts (``activation.flops``): the
  reference step's (no recompute: the model's useful FLOPs, for MFU) and its own (recompute included: hardware
  FLOPs, for HFU).
"""
