"""Every tier: when a test passed only after a rerun (``make test`` reruns a failure twice), the summary shows why
each failed attempt failed, so a flaky test can be diagnosed from a CI log that ended green."""

from __future__ import annotations

from typing import Any

TAIL_LINES = 40


def pytest_terminal_summary(terminalreporter: Any) -> None:
    reruns = terminalreporter.stats.get("rerun", [])
    if not reruns:
        return
    terminalreporter.section(f"why {len(reruns)} rerun attempt(s) failed")
    for report in reruns:
        text = (getattr(report, "longreprtext", "") or "").rstrip().splitlines()
        terminalreporter.write_line(f"--- {report.nodeid} ({report.when})")
        for line in text[-TAIL_LINES:]:
            terminalreporter.write_line(line)
