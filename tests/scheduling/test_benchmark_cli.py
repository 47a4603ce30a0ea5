"""benchmarks/scheduler.py's command line: what it refuses, and --passes 0 (no pass timed)."""

from __future__ import annotations

import pytest

from benchmarks import scheduler as benchmark


def test_no_pass_is_timed_with_passes_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert benchmark.main(["--skip-traces", "--passes", "0"]) == 0
    assert "one console pass" not in capsys.readouterr().out


def test_a_negative_number_of_passes_is_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        benchmark.main(["--skip-traces", "--passes", "-1"])
    assert refused.value.code == 2
    assert "--passes" in capsys.readouterr().err
