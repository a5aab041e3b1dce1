"""Spawned by test_ckpt_roots.py inside ``unshare --user --map-root-user --mount`` with a small tmpfs mounted at
ROOT (a private mount: nobody else sees it; no privileges needed where user namespaces are allowed).

Usage: python small_disk_writer.py ROOT. Prints one JSON object: what a save that does not fit did, first with the
free-space check on the real ``statvfs``, then with the check skipped (what happens when another process fills the
disk after it) for each writer: torch, safetensors, DCP, and a background save.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def main(root: Path) -> None:
    from ckpt_helpers import make_trainer
    from pytest_flashckpt.checkpoint import Checkpointer, DiskFullError
    from pytest_flashckpt.checkpoint import checkpointer as checkpointer_module
    from pytest_flashckpt.config.scenario import SaveConfig

    trainer = make_trainer()
    trainer.train_step()
    out: dict[str, object] = {"free_before": shutil.disk_usage(root).free}

    def attempt(name: str, config: SaveConfig) -> None:
        try:
            with Checkpointer(root / name, config) as ckpt:
                ckpt.save(trainer)
            out[name] = "saved"
        except DiskFullError as exc:
            out[name] = f"DiskFullError: {exc}"
        except BaseException as exc:  # reported, not raised: the test names what came instead
            out[name] = f"{type(exc).__name__}: {exc}"
        out[f"{name}_left"] = sorted(p.name for p in (root / name).iterdir()) if (root / name).is_dir() else None

    attempt("checked", SaveConfig(strategy="sync"))
    checkpointer_module.check_free_space = lambda *args: None  # the disk fills after the check
    for name, config in {"torch": SaveConfig(strategy="sync", format="torch"), "safetensors": SaveConfig(strategy="sync", format="safetensors"),
                         "dcp": SaveConfig(strategy="dcp"), "async": SaveConfig(async_save=True)}.items():
        attempt(name, config)
    out["free_after"] = shutil.disk_usage(root).free
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(Path(sys.argv[1]))
