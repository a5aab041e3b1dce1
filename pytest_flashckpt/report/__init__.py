"""Reports: results -> markdown and plots. ``write_report`` is what a suite run calls; ``render`` is the pure
text; ``compare_markdown`` sets two runs side by side (``flashckpt compare``)."""

from pytest_flashckpt.report.compare import compare_markdown
from pytest_flashckpt.report.markdown import REPORT_NAME, render, write_report

__all__ = ["REPORT_NAME", "compare_markdown", "render", "write_report"]
