"""The hardware/software profile a measurement belongs to; baselines are only compared within one profile."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
from typing import Any


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def current_profile(device: str, kernel: str | None = None) -> dict[str, Any]:
    """What changes results: device name and count, CPU threads, torch / CUDA / flash-attn versions, kernel."""
    import torch

    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        device_name = torch.cuda.get_device_name(index)
        device_count = torch.cuda.device_count()
    else:
        device_name = cpu_name()
        device_count = 1
    return {
        "device_type": device.split(":")[0],
        "device_name": device_name,
        "device_count": device_count,
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__.split("+")[0],
        "cuda": torch.version.cuda,
        "flash_attn": _version("flash-attn"),
        "kernel": kernel,
        "machine": platform.machine(),
    }


def run_kernel(device, dtypes) -> str:
    """The kernel ``auto`` picks for a run on ``device`` with the scenarios' ``dtypes`` (names such as
    ``bfloat16``): resolved with the run's most common dtype, so a bf16 GPU run's profile says ``flash_attn``
    where flash-attn can run, not the ``sdpa`` a float32 lookup would give. Ties go to the half-precision dtype."""
    import torch

    from pytest_flashckpt.models.attention import resolve_backend

    names = list(dtypes) or ["float32"]
    counts = {name: names.count(name) for name in names}
    most = max(counts.values())
    name = next((n for n in ("bfloat16", "float16") if counts.get(n) == most), max(counts, key=counts.get))
    return resolve_backend("auto", torch.device(device), getattr(torch, name))


def profile_id(profile: dict[str, Any]) -> str:
    """A readable, file-name-safe id: ``cpu-2t-torch2.13.0-<hash>`` (the hash covers every field)."""
    digest = hashlib.sha256(json.dumps(profile, sort_keys=True).encode()).hexdigest()[:8]
    if profile["device_type"] == "cuda":
        name = re.sub(r"[^a-z0-9]+", "-", profile["device_name"].lower()).strip("-")
        head = f"{name}-x{profile['device_count']}"
    else:
        head = f"cpu-{profile['cpu_threads']}t"
    return f"{head}-torch{profile['torch']}-{digest}"


def git_commit(cwd: str | None = None) -> str | None:
    """The commit of the checkout being measured, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd or os.getcwd(), capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the platform's word where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
