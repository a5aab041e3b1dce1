"""The assumptions ``flashckpt fit`` states in its output, each overridable from the command line (torch-free: the
command's parser reads them).

- ``DEFAULT_MARGIN``: fraction of a GPU's memory kept free for what the simulated live tensors do not count (the
  CUDA context, NCCL's and cuBLAS's workspaces, the caching allocator's rounding and fragmentation). Not measured
  on a GPU yet: ``benchmarks/gpu_margin.py`` measures it on the first GPU (its ``needed, % of device`` column is
  this quantity; docs/will-it-fit.md, "The GPU margin"); 10 % of 80 GiB is 8 GiB, above the 1-3 GiB the CUDA context and
  NCCL buffers usually take, to leave room for fragmentation.
- ``DEFAULT_MFU``: fraction of the bf16 peak the step's matmuls reach, recomputation included; torchtitan reports
  50.5-58.2 % MFU for its Llama 3 FSDP runs on 64 A100s (pytorch/torchtitan docs/performance.md).
- ``DEFAULT_STORAGE_GBPS``: checkpoint write bandwidth per node, GB/s; a parallel file system's share per node
  varies by an order of magnitude between clusters: state yours.
"""

DEFAULT_MARGIN = 0.10
DEFAULT_MFU = 0.5
DEFAULT_STORAGE_GBPS = 2.0
