"""Errors gpuctl reports, each with the exit code it ends the program with."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # a refused request (400) or bad command-line / spec input, like argparse
EXIT_INTERRUPTED = 130  # Ctrl-C, or a job that ended cancelled


class CliError(Exception):
    """A failure to report in one readable message (never a traceback)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class UsageError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class Unreachable(CliError):
    """The console did not answer (connection refused, DNS, timeout): worth retrying while waiting."""


class ApiError(CliError):
    """The console answered with an error status."""

    def __init__(self, message: str, *, status: int, payload: Any, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message, exit_code)
        self.status = status
        self.payload = payload

    @property
    def transient(self) -> bool:
        return self.status in (429, 502, 503, 504)


def format_field_errors(payload: Any, prefix: str = "") -> list[str]:
    """DRF error bodies as `field.sub: message` lines, e.g. {"workload": {"params": {"epochs": [..]}}}."""
    lines: list[str] = []
    if isinstance(payload, dict):
        for key, value in payload.items():
            name = "" if key in ("non_field_errors", "detail") else str(key)
            lines += format_field_errors(value, f"{prefix}.{name}" if prefix and name else prefix or name)
    elif isinstance(payload, list):
        for item in payload:
            lines += format_field_errors(item, prefix)
    else:
        lines.append(f"{prefix}: {payload}" if prefix else str(payload))
    return lines


def detail_of(payload: Any) -> str:
    """The human part of an error body: `detail`, or the field errors on one line."""
    if isinstance(payload, dict) and isinstance(detail := payload.get("detail"), str):
        return detail
    if payload in (None, "", {}, []):
        return ""
    return "; ".join(format_field_errors(payload))
