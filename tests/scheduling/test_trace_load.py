"""Load factors and all-at-start arrivals of a trace (trace.with_load, trace.all_submitted_at_start), and the
held-out trace kept with the benchmark (benchmarks/traces/muri/trace2.csv, checked there byte for byte)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.scheduling.trace import TraceJob, all_submitted_at_start, load_trace, with_load

TRACE2 = Path(__file__).resolve().parents[2] / "benchmarks" / "traces" / "muri" / "trace2.csv"


def _job(job_id: int, submit_s: float) -> TraceJob:
    return TraceJob(job_id=job_id, gpus=1, submit_s=submit_s, duration_s=100.0, model="resnet18")


def test_load_factor_divides_the_gaps_between_submissions_and_keeps_the_work():
    jobs = [_job(0, 10.0), _job(1, 30.0), _job(2, 70.0)]
    assert [j.submit_s for j in with_load(jobs, 2.0)] == [10.0, 20.0, 40.0]
    assert [j.submit_s for j in with_load(jobs, 0.5)] == [10.0, 50.0, 130.0]
    assert [j.duration_s for j in with_load(jobs, 2.0)] == [100.0] * 3
    assert with_load(jobs, 1.0) is jobs
    with pytest.raises(ValueError):
        with_load(jobs, 0.0)


def test_all_submitted_at_start_is_the_pr_variant_of_a_muri_trace():
    jobs = [_job(0, 0.0), _job(1, 30.0), _job(2, 70.0)]
    assert [j.submit_s for j in all_submitted_at_start(jobs)] == [0.0, 0.0, 0.0]
    assert all_submitted_at_start([]) == []


def test_the_bundled_trace2_loads_whole():
    jobs = load_trace(TRACE2, "muri", "muri")
    assert len(jobs) == 5755
    assert [j.job_id for j in jobs[:3]] == [0, 1, 2]
    assert jobs[-1].submit_s == pytest.approx(8_572_283.0)
