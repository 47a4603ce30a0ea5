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


def test_a_pollux_set_is_summed_up_over_its_workloads_with_their_jobs_pooled(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two workloads of the 2x set, FIFO on exact declarations: one line for the set, with the mean of their
    averages and p99s, and the p99 of their jobs together."""
    assert benchmark.main([
        "--traces", "pollux-2.0-w1,pollux-2.0-w2", "--declarations", "exact", "--policies", "fifo",
        "--passes", "0", "--preempt-cost-s", "0",
    ]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("pollux-2.0 ")]
    assert len(rows) == 1
    _, load, mode, policy, workloads, avg, p99, pooled = rows[0]
    assert (load, mode, policy, workloads) == ("1", "exact", "fifo", "2")
    tables = [line.split() for line in out.splitlines() if line.startswith("fifo ")]
    averages, p99s = [float(row[1]) for row in tables], [float(row[2]) for row in tables]
    assert float(avg) == pytest.approx(sum(averages) / 2, abs=0.01)  # (the tables round to 0.01)
    assert float(p99) == pytest.approx(sum(p99s) / 2, abs=0.01)
    # (a quantile of two sets' union lies between theirs)
    assert min(p99s) - 0.01 <= float(pooled) <= max(p99s) + 0.01
