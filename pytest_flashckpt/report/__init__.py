"""Reports: results -> markdown (and plots). ``write_report`` is what a suite run calls."""

from pytest_flashckpt.report.markdown import summary_lines, write_report

__all__ = ["summary_lines", "write_report"]
