"""benchmarks/estimate_lab.py's scoring: as metrics.EstimateFigures scores, and the online calibration it tries."""

import math

import pytest

from apps.scheduling.estimate import BURST_GAP_S, Waiting
from benchmarks.estimate_lab import (
    calibrated,
    horizon_class,
    relative_errors,
    sweep_count_model,
    sweep_going_on,
    sweep_size_model,
    sweep_sizes,
)


def test_relative_errors_count_waiting_jobs_only_and_a_missing_estimate_as_missed() -> None:
    starts = {1: (0.0, 100.0, True), 2: (0.0, 0.0, False), 3: (0.0, 50.0, True), 4: (0.0, None, True)}
    errors = relative_errors(starts, {1: 150.0, 2: 0.0, 3: None})
    assert errors == [pytest.approx(0.5), math.inf]


def test_calibration_scales_by_the_median_ratio_of_its_class_known_at_submission() -> None:
    # ten jobs told 100 s that waited 200 s, each started before the next was submitted
    starts = {i: (1000.0 * i, 1000.0 * i + 200, True) for i in range(10)}
    estimates: dict[int, float | None] = {i: 1000.0 * i + 100 for i in range(10)}
    starts[10], estimates[10] = (20_000.0, 20_200.0, True), 20_100.0
    scaled = calibrated(starts, estimates)
    assert scaled[10] == pytest.approx(20_200.0)
    assert scaled[9] == estimates[9]  # (nine known then: too few)


def test_a_job_still_waiting_past_its_estimate_counts_as_a_lower_bound() -> None:
    starts = {i: (float(i), 10_000.0, True) for i in range(10)}
    estimates: dict[int, float | None] = {i: i + 100.0 for i in range(10)}
    starts[10], estimates[10] = (1000.0, 1100.0, True), 1100.0
    scaled = calibrated(starts, estimates)
    # each had waited about 1000 s of its 100 s estimate when job 10 came
    assert scaled[10] == pytest.approx(1000.0 + 100.0 * 9.955)  # (the median of (1000 - i) / 100)
    assert horizon_class(100.0) == 0 and horizon_class(600.0) == 1


def test_the_sweep_going_on_is_the_chain_of_close_submissions_up_to_now() -> None:
    def job(job_id: int, at: float) -> Waiting:
        return Waiting(job_id, (0, 1.0, at, job_id), "a", "u", 1, None, 100, 60.0, 1.0)

    now = 10_000.0
    recent = [job(1, now - 3 * BURST_GAP_S), job(2, now - 60), job(3, now - 30), job(4, now + 5)]
    assert [w.job_id for w in sweep_going_on(now, recent)] == [3, 2]
    # two more submissions close after now, then a gap: two copies of the sweep's jobs, latest first
    starts = {i: (at, None, True) for i, at in enumerate([now + 10, now + 20, now + 20 + 2 * BURST_GAP_S])}
    expected = sweep_count_model(starts)(now, recent)
    assert [(at, w.job_id, w.order[2]) for at, w in expected] == [(now + 10, 3, now + 10), (now + 20, 2, now + 20)]


def test_a_declared_size_expects_the_rest_of_the_sweep_at_its_pace_so_far() -> None:
    def job(job_id: int, at: float) -> Waiting:
        return Waiting(job_id, (0, 1.0, at, job_id), "a", "u", 1, None, 100, 60.0, 1.0)

    now = 1_000.0
    # a sweep of five jobs (three so far, 40 s apart: a pace of 80 / 3 s), an earlier one of two
    times = [0.0, 10.0, now - 80, now - 40, now, now + 30, now + 60]
    starts = {i: (at, None, True) for i, at in enumerate(times)}
    assert sweep_sizes(starts) == {0.0: 2, 10.0: 2, now - 80: 5, now - 40: 5, now: 5, now + 30: 5, now + 60: 5}
    recent = [job(1, 10.0), job(2, now - 80), job(3, now - 40), job(4, now)]
    expected = sweep_size_model(starts)(now, recent)
    assert [(at, w.job_id, w.expected) for at, w in expected] == [
        (pytest.approx(now + 80 / 3), 4, True),
        (pytest.approx(now + 160 / 3), 3, True),
    ]


def test_true_runtimes_tell_the_replay_what_each_job_has_left_and_are_put_back_after() -> None:
    from pathlib import Path

    import apps.scheduling.scheduler as scheduler_module
    from apps.scheduling.ordering import NeverRun
    from apps.scheduling.prediction import RuntimeHistory
    from apps.scheduling.trace import load_trace
    from apps.scheduling.types import PendingJob, Priority, RunningJob
    from benchmarks.estimate_lab import true_runtimes

    bundled = Path(__file__).resolve().parents[2] / "benchmarks" / "traces"
    first = load_trace(bundled / "muri" / "trace2.csv", "muri", "muri")[0]
    running = RunningJob(first.job_id, "t", "u", 1, Priority.NORMAL, (0,), started_at=100.0, submitted_at=0.0,
                         attained_gpu_seconds=30.0)
    waiting = PendingJob(first.job_id, "t", "u", 1, Priority.NORMAL, submitted_at=0.0)
    history = RuntimeHistory()
    originals = (scheduler_module.predict_remaining, NeverRun.figures, RuntimeHistory.expected_hold_s)
    with true_runtimes("trace2", bundled):
        assert scheduler_module.predict_remaining(running, 160.0, history, 3600.0)[0] == pytest.approx(
            first.duration_s - 90.0)  # 30 s run before, 60 s now
        assert NeverRun(history).figures(waiting, 3600.0)[0] == pytest.approx(first.duration_s)
        assert history.expected_hold_s(0.0, 100.0) is None
    assert (scheduler_module.predict_remaining, NeverRun.figures, RuntimeHistory.expected_hold_s) == originals
