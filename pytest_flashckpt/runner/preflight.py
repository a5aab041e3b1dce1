"""Everything about a run that can be checked before its first scenario: where it writes (report, baseline and
work folders), the device and probe asked for, this profile's baseline file, and whether the suite fits the
machine (predicted host memory per scenario, disk for its checkpoints). A measured run never ends in a
traceback because of one of these: each is one ``ConfigError`` line naming the option or file, the scenario and
key, and the fix, raised before anything is measured. The scenario-level checks (model cards, sequence lengths)
are ``config.preflight.preflight``, run when the suite is loaded. It also removes what a killed earlier run left
(checkpoint work folders no live process holds, temporary files of a baseline or report write).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from pytest_flashckpt.config.errors import ConfigError
from pytest_flashckpt.config.preflight import ModelShape, check_output_folder, check_resources

Flag = Callable[[str], str]  # option name (``flashckpt-report``) -> the flag as this front end spells it


def pytest_flag(name: str) -> str:
    return f"--{name}"


def command_flag(name: str) -> str:
    return "--" + name.removeprefix("flashckpt-")


def host_memory_bytes() -> int | None:
    """The memory this process may use: physical memory (``os.sysconf``), or a smaller cgroup limit."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
        break
    return total


def check_run(run, flag: Flag = pytest_flag) -> None:
    """Check a ``runner.suite.SuiteRun`` before it measures anything; ConfigError (one line) on the first problem."""
    from pytest_flashckpt.baselines.store import BaselineError, check_saveable

    o = run.options
    check_output_folder(flag("flashckpt-report"), run.report_dir, run.shown)
    work = Path(o.workdir) if o.workdir else Path(tempfile.gettempdir())
    check_output_folder(flag("flashckpt-workdir"), work, run.shown)
    ctx = _context(run, flag)
    if not o.no_compare or o.save_baseline:
        directory = run.baseline_dir
        if directory.exists() and not directory.is_dir():
            raise ConfigError(flag("flashckpt-baseline-dir"), f"{run.shown(directory)} is a file, not a folder of baselines",
                              f"pass {flag('flashckpt-baseline-dir')}=FOLDER, or move the file")
        _, profile_id = ctx.profile()
        try:
            gate = run.gate()  # reads this profile's baseline once, for the whole run (the gate keeps it)
            if o.save_baseline:
                check_saveable(directory, profile_id, read=gate.baseline is None)
        except BaselineError as exc:
            raise ConfigError("", str(exc).replace(str(directory), run.shown(directory))) from None
    _tidy(run, work)
    existing = work if work.exists() else next(p for p in work.parents if p.exists())
    check_resources(run.suite.scenarios, run.suite.origin, host_memory_bytes(), shutil.disk_usage(existing).free,
                    run.shown(work), on_cpu=ctx.device.type == "cpu", shape_of=lambda s: hf_shape(s, run.suite.origin(s)),
                    load=run.cards.load)


def hf_shape(scenario, where: str) -> ModelShape | None:
    """A Hugging Face scenario's config checked with transformers (the model type builds a causal LM, the heads
    divide, the anatomy fits its first layer built on meta) and its size counted without building it
    (``models.hf.build.parameter_count``), for the host-memory and disk predictions; a problem is a ConfigError
    naming ``where``, the scenario and the key. None without transformers: the run skips the scenario with the
    install line."""
    from pytest_flashckpt.models.hf.build import HFConfigProblem, HFUnavailable, check_anatomy, hf_config, parameter_count

    spec = scenario.model
    try:
        config = hf_config(spec.hf, spec.dropout)
        parameters = parameter_count(config)
        check_anatomy(config, spec.anatomy)
    except HFUnavailable:
        return None
    except HFConfigProblem as exc:
        raise ConfigError(where, exc.problem, exc.fix, scenario=scenario.name, key=exc.key) from None
    except ValueError as exc:
        raise ConfigError(where, str(exc), scenario=scenario.name) from None
    return ModelShape(scenario.card, parameters, config.num_hidden_layers, config.hidden_size, config.vocab_size)


def _context(run, flag: Flag):
    """The run's device and probe, resolved now: a device or probe this machine lacks is the option's error."""
    import torch

    from pytest_flashckpt.runner.context import SkipScenario

    try:
        ctx = run.context
    except (SkipScenario, ValueError, RuntimeError, AssertionError) as exc:
        raise ConfigError(flag("flashckpt-device"), str(exc),
                          f"use {flag('flashckpt-device')}=cpu (or auto) on this machine") from None
    if ctx.probe in ("cuda", "nvml") and ctx.device.type != "cuda":
        why = (f"torch {torch.__version__} sees no CUDA device" if not torch.cuda.is_available()
               else f"the run is on {ctx.device}")
        raise ConfigError(flag("flashckpt-probe"), f"{ctx.probe!r} measures GPU memory, but {why}",
                          f"use {flag('flashckpt-probe')}=cpu (or auto), or run on a GPU with {flag('flashckpt-device')}=cuda")
    if ctx.probe == "nvml":
        try:
            import pynvml  # noqa: F401
        except ImportError:
            raise ConfigError(flag("flashckpt-probe"), "'nvml' needs the nvidia-ml-py package (import pynvml)",
                              f"pip install nvidia-ml-py, or use {flag('flashckpt-probe')}=cuda") from None
    return ctx


def _tidy(run, work: Path) -> None:
    """What a killed earlier run left: its checkpoint work folders (``files.remove_abandoned``: only folders no live
    process holds) and the temporary files of a baseline or report write (``files.remove_stale_temp``)."""
    from pytest_flashckpt.core.files import remove_abandoned, remove_stale_temp

    if work.is_dir():
        removed = remove_abandoned(work)
        if removed:
            run.notes.append(f"removed {len(removed)} checkpoint work folder(s) a killed earlier run left in {run.shown(work)}")
    for folder in (run.baseline_dir, run.report_dir):
        if folder.is_dir():
            remove_stale_temp(folder)
