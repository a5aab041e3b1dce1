"""Scenarios past one process: torchrun ranks, FSDP2-sharded models and sharded DCP checkpoints.

Everything runs on PyTorch's own distributed engine (``torch.distributed.run``, ``fully_shard``,
``torch.distributed.checkpoint``); nothing here shards or communicates by hand. Modules, bottom up:

- ``lock``: one writer per checkpoint folder (a lock file naming pid and host; stale locks are taken over).
- ``fsdp``: process group, activation strategy then ``fully_shard`` per block and at the root, a data-parallel trainer.
- ``sharded_store``: DCP saves (sync and async) under the single-process commit protocol and manifest; loads into
  any world size or into a plain model; gathered full state for bitwise comparisons.
- ``memory``: the exact ``cpu`` probe aware of FSDP2's in-place storage frees.
- ``rank``: the per-rank entry point (``python -m pytest_flashckpt.distributed.rank``) torchrun starts.
- ``launcher``: free port, torchrun command (or a launcher prefix for srun/mpirun), timeouts, process-group kill.
- ``aggregate``: per-rank metrics JSON -> one ``Result``; ``scenario_run``: what the runner calls for ``world_size > 1``.
- ``reshard``: the N -> M resharding proof (save at N ranks, load at M, compare bit for bit).

See the README's "Distributed" section.
"""
