"""The fault table printed at the end of a run (asked for in the reliability issue), across pytest-xdist workers.

Each worker hands its rows to the controller through xdist's `workeroutput`; the controller, or a run without
xdist, prints them all in the terminal summary (hooks in tests/conftest.py, which every process loads).
"""

from __future__ import annotations

ROWS: list[tuple[str, str, str, str]] = []


def record(fault: str, outcome: str, recovery_s: float | None, jobs_lost: int) -> None:
    ROWS.append((fault, outcome, "-" if recovery_s is None else f"{recovery_s:.1f} s", str(jobs_lost)))


def print_table(terminalreporter) -> None:
    if not ROWS:
        return
    terminalreporter.section("fault table")
    terminalreporter.write_line("| fault | what happened | recovery | jobs lost |")
    terminalreporter.write_line("|---|---|---|---|")
    for row in ROWS:
        terminalreporter.write_line("| " + " | ".join(row) + " |")
