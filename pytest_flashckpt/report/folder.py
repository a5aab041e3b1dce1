"""The folder a suite run writes its results and report into.

The default folder (``flashckpt-report/``) is made self-ignoring when the run creates it: a ``.gitignore`` holding
``*``, as pytest does for ``.pytest_cache``, so a run leaves ``git status`` clean in any repository without an entry
in that repository's own ``.gitignore``. A folder that already exists, or one named with ``--flashckpt-report``
(for example ``reports/sample``, whose files are meant to be committed), is left as it is.
"""

from __future__ import annotations

from pathlib import Path

from pytest_flashckpt.core.files import locked
from pytest_flashckpt.core.result import RunRecord

GITIGNORE_TEXT = "# created by pytest-flashckpt: a run's results and report, not meant to be committed\n*\n"


def make_report_folder(folder: Path, *, self_ignoring: bool) -> Path:
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    if created and self_ignoring:
        (folder / ".gitignore").write_text(GITIGNORE_TEXT, encoding="utf-8")
    return folder


def write_run_folder(record: RunRecord, folder: Path) -> tuple[Path, Path]:
    """Write a run's ``results.json``, markdown report and plots into ``folder`` as one unit: under a lock on the
    folder (``files.locked``), so a second run writing the same folder at once waits, then replaces all of them;
    the folder never holds one run's results beside another's report. Returns (results path, report path)."""
    from pytest_flashckpt.report.markdown import write_report

    with locked(folder):
        results_path = Path(folder) / "results.json"
        record.write_json(results_path)
        return results_path, write_report(record, folder)
