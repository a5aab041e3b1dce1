"""Where a benchmark's report goes: printed (the script's ``--print`` or ``--only``: nothing written) or written to its
file under ``reports/`` and the file's path printed. A benchmark run as ``python benchmarks/<name>.py`` imports it as
``report_output`` (its own folder is first on ``sys.path``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def write_or_print(text: str, report: Path, *, print_only: bool) -> None:
    """Print ``text`` when ``print_only``; otherwise write it to ``report`` (UTF-8) and print that path."""
    if print_only:
        print(text)
    else:
        report.write_text(text, encoding="utf-8")
        print(report)


def print_only_flag(doc: str | None) -> bool:
    """The ``--print`` flag of a spike with no other options (its parser described by ``doc``'s first line)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--print", action="store_true", help="print the report instead of writing it")
    return parser.parse_args().print


def produced_by(script: str, load_before: float) -> str:
    """A report's provenance line: the command as run (``sys.argv``), this machine and its CPU model (hosts of one
    profile differ in speed: times are comparable only on one CPU), torch, and the load average (1 min) before the
    run and now (torch imported here for its version)."""
    import os
    import platform
    import sys

    import torch

    from pytest_flashckpt.runner.profile import cpu_name

    argv = " ".join(sys.argv[1:])
    return (f"Produced by `python benchmarks/{script}{(' ' + argv) if argv else ''}` on {platform.node()} "
            f"({os.cpu_count()} cores of {cpu_name()}, shared), torch {torch.__version__}; load average (1 min) before / after: "
            f"{load_before:.2f} / {os.getloadavg()[0]:.2f}.")
