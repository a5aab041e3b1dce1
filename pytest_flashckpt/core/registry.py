"""The families, named once: memory probes, activation strategies and save strategies.

Each entry is a name and a one-line description (probes also the class that implements them and whether their
byte counts are exact). Option choices and help, the config ``Literal`` types, validation messages and the
report's wording all derive from these tables, so a new family member is registered here and implemented in its
own module (docs/architecture.md, "Adding a probe" / "Adding a save strategy").

Nothing here imports torch or another part of the project: config (the bottom layer) reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    target: str  # "module:Class"; the class is built with ``device`` when ``takes_device``
    exact: bool  # byte counts deterministic to the byte (judged exactly by the gate)
    description: str
    takes_device: bool = False


PROBES: dict[str, ProbeSpec] = {
    spec.name: spec
    for spec in (
        ProbeSpec("cpu", "pytest_flashckpt.probes.cpu:LiveTensorProbe", True,
                  "live-tensor accounting (TorchDispatchMode), deterministic to the byte; it does not see 0-dim tensors made "
                  "from Python scalars outside the dispatcher, nor scratch memory inside one op (measured gap per step: "
                  "`python benchmarks/probe_gap.py`, reports/probe-gap.md)"),
        ProbeSpec("cuda", "pytest_flashckpt.probes.cuda:CudaAllocatorProbe", False,
                  "CUDA caching-allocator peak after reset_peak_memory_stats", takes_device=True),
        ProbeSpec("nvml", "pytest_flashckpt.probes.nvml:NvmlProbe", False,
                  "device memory sampled with NVML in a thread (a lower bound; CUDA context reported apart)", takes_device=True),
        ProbeSpec("rss", "pytest_flashckpt.probes.rss:RssProbe", False,
                  "process resident set size (a sanity check, not tensor memory)"),
    )
}
PROBE_NAMES: tuple[str, ...] = tuple(PROBES)


def is_exact_probe(name: str | None) -> bool:
    spec = PROBES.get(name or "")
    return spec is not None and spec.exact


def default_probe_name(device_type: str) -> str:
    """``auto``: the allocator probe on a GPU, exact accounting on the CPU."""
    return "cuda" if device_type == "cuda" else "cpu"


ACTIVATION_STRATEGIES: dict[str, str] = {
    "none": "nothing recomputed (the reference)",
    "full": "every block recomputed in the backward pass; only block inputs kept",
    "every_k": "blocks 0, k, 2k, ... recomputed",
    "selective_op": "matmul and attention outputs kept, pointwise ops recomputed (a selective-checkpoint policy)",
    "offload": "every block's saved tensors moved to pinned CPU memory (GPU only)",
    "budget": "per input shape, the plan with the least recomputation whose measured peak fits activation.budget",
}

SAVE_STRATEGIES: dict[str, str] = {
    "none": "no checkpoint saved",
    "sync": "one file written in the training loop (the reference save)",
    "async": "snapshot into a staging area, then written by a background thread",
    "dcp": "torch.distributed.checkpoint (optionally its async_save)",
    "selective": "selected tensors saved on top of a full base checkpoint",
    "layerwise": "one file per block plus the rest",
    "scheduled": "saves deferred while memory in use is above a threshold",
}


def describe(table: dict[str, str]) -> str:
    """``a (what a does), b (...)``: choices with their meaning, for help texts and error messages."""
    return "; ".join(f"{name}: {text}" for name, text in table.items())
