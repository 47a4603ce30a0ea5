"""The shim's cleanup after the agent died: retried until the command succeeds, its failure written to the log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from workers.agent.shim import orphan_cleanup


def refusing(tries_file: Path, refusals: int) -> list[str]:
    """A command that fails `refusals` times (as podman does while conmon holds the container), then succeeds."""
    script = (f"import pathlib, sys; p = pathlib.Path({str(tries_file)!r}); n = int(p.read_text() or 0) + 1; "
              f"p.write_text(str(n)); print('container is being removed', file=sys.stderr); "
              f"sys.exit(0 if n > {refusals} else 125)")
    tries_file.write_text("0")
    return [sys.executable, "-c", script]


def test_the_cleanup_is_retried_until_it_succeeds(tmp_path: Path) -> None:
    tries = tmp_path / "tries"
    assert orphan_cleanup(refusing(tries, refusals=2)) is True
    assert tries.read_text() == "3"


def test_a_cleanup_that_keeps_failing_stops_at_its_deadline_and_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tries = tmp_path / "tries"
    assert orphan_cleanup(refusing(tries, refusals=10**6), deadline_s=0.5) is False
    said = capsys.readouterr().err
    assert "cleanup failed" in said and "exit 125" in said and "container is being removed" in said
    assert int(tries.read_text()) >= 1
