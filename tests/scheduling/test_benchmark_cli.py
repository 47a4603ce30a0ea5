"""benchmarks/scheduler.py's command line: what it refuses, --passes 0 (no pass timed), and the pass timed beside
the core before the speed-up."""

from __future__ import annotations

from pathlib import Path

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


def test_the_pass_clock_times_the_core_under_a_code_root() -> None:
    timings = benchmark.clock_passes(benchmark.REPO, 1)
    assert len(timings) == 1 and timings[0] > 0


def test_a_baseline_git_cannot_give_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmark, "BASELINE_COMMIT", "0" * 40)
    why_not = benchmark.extract_baseline(tmp_path)
    assert why_not is not None and "git" in why_not
    assert not any(tmp_path.iterdir())
