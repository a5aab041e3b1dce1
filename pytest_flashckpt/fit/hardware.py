"""The device and interconnect table the time model reads: per GPU, its dense bf16 peak, its memory and memory
bandwidth, its NVLink bandwidth inside a node and its InfiniBand bandwidth between nodes, each with its source.

Bandwidths are per GPU and per direction (a ring collective's bound: every GPU sends and receives at once), in
bytes/s. NVIDIA prints NVLink as the bidirectional total per GPU (900 GB/s on Hopper, 600 GB/s on A100), so half is
stored; the network figure is the one ConnectX adapter per GPU of the DGX/HGX systems (400 Gb/s NDR on Hopper, 200
Gb/s HDR on A100), in bytes. A collective's latency (a base per call, one per ring hop) is NCCL's own
tuning model's. The dense bf16 peak is the project's datasheet table (``throughput/device_peaks.yaml``,
read by ``throughput.peaks``), so one figure has one source.

Any field can be replaced from the command line (``--peak-tflops``, ``--nvlink-gbps``, ...) or from a YAML file
(``--hardware FILE``: a mapping ``{name: {field: value}}`` that adds devices or overrides fields of known ones).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from pytest_flashckpt.config.errors import InputError
from pytest_flashckpt.throughput.peaks import lookup

GB = 10**9
# NVIDIA/nccl src/graph/tuning.cc, the ring / Simple protocol column: baseLat 8.4 us per collective, hwLat 3.4 us
# per NVLink hop and 14 us per network hop (NCCL's own model of a collective's latency, what it picks algorithms by)
NCCL_SOURCE = "NVIDIA/nccl src/graph/tuning.cc (baseLat, hwLat: ring, Simple protocol)"
NCCL_RING_BASE_LATENCY_S = 8.4e-6
NCCL_NVLINK_HOP_LATENCY_S = 3.4e-6
NCCL_NETWORK_HOP_LATENCY_S = 14e-6


@dataclass(frozen=True)
class Device:
    """One GPU model as the time model sees it (see the module doc). Rates in FLOP/s and bytes/s."""

    name: str
    product: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s
    memory_bytes: int
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per GPU, per direction, inside a node
    network_bytes_per_s: float  # per GPU, per direction, between nodes (InfiniBand / RoCE)
    gpus_per_node: int
    sources: tuple[str, ...]
    # a ring collective's latency: a base per call plus one per hop (NCCL's own tuning model, ring / Simple protocol)
    collective_latency_s: float = NCCL_RING_BASE_LATENCY_S
    nvlink_hop_latency_s: float = NCCL_NVLINK_HOP_LATENCY_S
    network_hop_latency_s: float = NCCL_NETWORK_HOP_LATENCY_S

    def link_bytes_per_s(self, group_span_gpus: int) -> float:
        """The per-GPU bandwidth of a ring over ``group_span_gpus`` consecutive GPUs: NVLink when the ring stays
        inside one node, the network adapter once it crosses nodes (the slowest link bounds a ring)."""
        return self.nvlink_bytes_per_s if group_span_gpus <= self.gpus_per_node else self.network_bytes_per_s

    def hop_latency_s(self, group_span_gpus: int) -> float:
        return self.nvlink_hop_latency_s if group_span_gpus <= self.gpus_per_node else self.network_hop_latency_s


def _bf16_peak(device_name: str) -> float:
    peak = lookup("cuda", device_name, "bf16")
    assert peak.flops_per_s is not None, peak.reason  # the names below are rows of device_peaks.yaml
    return peak.flops_per_s


_HOPPER_NET = "NVIDIA DGX H100/H200 user guide, 'Hardware Overview': 8x ConnectX-7 400 Gb/s InfiniBand/Ethernet, one per GPU"


def _table() -> dict[str, Device]:
    return {
        "a100-sxm": Device(
            "a100-sxm", "NVIDIA A100-SXM4-80GB", _bf16_peak("NVIDIA A100-SXM4-80GB"), 80 * 2**30, 2039 * GB,
            300 * GB, 25 * GB, 8,
            ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
             " (BF16 312 TFLOPS dense, HBM2e 2,039 GB/s, NVLink 600 GB/s bidirectional)",
             "NVIDIA DGX A100 user guide, 'Hardware Overview': 8x ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU")),
        "h100-sxm": Device(
            "h100-sxm", "NVIDIA H100 80GB HBM3", _bf16_peak("NVIDIA H100 80GB HBM3"), 80 * 2**30, 3350 * GB,
            450 * GB, 50 * GB, 8,
            ("https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
             " (H100 SXM: BF16 1,979 TFLOPS with sparsity, 3.35 TB/s, NVLink 900 GB/s bidirectional)", _HOPPER_NET)),
        "h200-sxm": Device(
            "h200-sxm", "NVIDIA H200", _bf16_peak("NVIDIA H200"), 141 * 10**9, 4800 * GB, 450 * GB, 50 * GB, 8,
            ("https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: BF16 1,979 TFLOPS with sparsity, 141 GB "
             "HBM3e, 4.8 TB/s, NVLink 900 GB/s bidirectional)", _HOPPER_NET)),
    }


DEVICES: dict[str, Device] = _table()
DEFAULT_DEVICE = "h100-sxm"

# CLI option -> Device field, with the unit the option is written in (bytes/s and FLOP/s in the table)
OVERRIDES: dict[str, tuple[str, float]] = {
    "peak_tflops": ("peak_flops", 1e12),
    "hbm_gbps": ("hbm_bytes_per_s", GB),
    "nvlink_gbps": ("nvlink_bytes_per_s", GB),
    "network_gbps": ("network_bytes_per_s", GB),
    "gpus_per_node": ("gpus_per_node", 1),
}


def _apply(device: Device, fields: dict, where: str) -> Device:
    known = {f.name for f in dataclasses.fields(Device)} - {"name"}
    changes = {}
    for key, value in fields.items():
        if key not in known:
            raise InputError(f"{where}: unknown field {key!r}; valid: {', '.join(sorted(known))}")
        if key == "sources":
            value = tuple(value) if isinstance(value, list) else (str(value),)
        elif key != "product" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise InputError(f"{where}: {key} must be a positive number, got {value!r}")
        changes[key] = int(value) if key in ("gpus_per_node", "memory_bytes") else value
    return dataclasses.replace(device, **changes)


def load_hardware_file(path: str | Path, table: dict[str, Device] | None = None) -> dict[str, Device]:
    """The table with ``path``'s rows applied: ``{name: {field: value}}``; a known name overrides the fields it
    names, a new name must give every field. An ``InputError`` naming the file, the device and the key otherwise."""
    table = dict(DEVICES if table is None else table)
    where = f"--hardware {path}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{where}: cannot read the hardware table ({exc.__class__.__name__}: {exc})".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of device name -> fields (e.g. h100-sxm: {{nvlink_bytes_per_s: 4.5e11}})")
    for name, fields in data.items():
        if not isinstance(fields, dict):
            raise InputError(f"{where}: device {name!r}: expected a mapping of fields")
        if name in table:
            table[name] = _apply(table[name], fields, f"{where}: device {name!r}")
        else:
            missing = [f.name for f in dataclasses.fields(Device) if f.name != "name" and f.name not in fields]
            if missing:
                raise InputError(f"{where}: new device {name!r} lacks {', '.join(missing)}; give every field "
                                 f"(or name a known device: {', '.join(table)})")
            template = next(iter(table.values()))
            table[name] = _apply(dataclasses.replace(template, name=str(name)), fields, f"{where}: device {name!r}")
    return table


def choose_device(name: str, table: dict[str, Device] | None = None, **overrides: float | None) -> Device:
    """The device ``name`` of ``table`` with the CLI's overrides (``OVERRIDES``; None: keep the table's)."""
    table = DEVICES if table is None else table
    if name not in table:
        raise InputError(f"--device {name}: unknown device; valid: {', '.join(table)} (or add it with --hardware FILE)")
    device = table[name]
    changes = {}
    for option, value in overrides.items():
        if value is None:
            continue
        field, unit = OVERRIDES[option]
        if value <= 0:
            raise InputError(f"--{option.replace('_', '-')} {value}: must be more than zero")
        changes[field] = int(value) if field == "gpus_per_node" else value * unit
    return dataclasses.replace(device, **changes)
