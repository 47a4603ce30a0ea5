from dataclasses import replace

import pytest

from apps.scheduling.prediction import FinishedRun, RuntimeHistory, predict_remaining_s, predict_total_s

from .helpers import pending, running


def test_declared_steps_times_observed_step():
    job = pending(1, declared_steps=1000, steps_done=400, observed_step_s=2.0)
    assert predict_remaining_s(job, 0.0, None, 99.0) == 1200.0


def test_running_job_extrapolates_steps_since_its_report():
    job = running(1, (0,), declared_steps=1000, steps_done=100, observed_step_s=1.0, steps_reported_at=50.0)
    assert predict_remaining_s(job, 150.0, None, 99.0) == pytest.approx(800.0)


def test_history_gives_step_time_then_runtime_then_time_limit_then_default():
    history = RuntimeHistory()
    history.record("u", "bert", FinishedRun(gpus=2, runtime_s=500.0, step_s=0.5))
    history.record("u", "bert", FinishedRun(gpus=4, runtime_s=300.0, step_s=0.25))
    with_steps = pending(1, gpus=4, declared_steps=1000, similarity_key="bert")
    assert predict_total_s(with_steps, history, 1.0) == 250.0
    no_steps = pending(2, gpus=2, similarity_key="bert")
    assert predict_total_s(no_steps, history, 1.0) == 500.0
    # Another user's run of the same program and GPU count: anyone's runs when the user has none ...
    other_user = pending(3, user="v", gpus=2, similarity_key="bert", time_limit_s=7200.0)
    assert predict_total_s(other_user, history, 1.0) == 500.0
    # ... and of other GPU counts only three or more of them (similar_runs, the order's rule too): two are not
    assert predict_total_s(replace(other_user, gpus=1), history, 1.0) == 7200.0
    history.record("w", "bert", FinishedRun(gpus=8, runtime_s=100.0, step_s=0.1))
    assert predict_total_s(replace(other_user, gpus=1), history, 1.0) == 300.0
    other_program = pending(3, user="v", similarity_key="gpt", time_limit_s=7200.0)
    assert predict_total_s(other_program, history, 1.0) == 7200.0
    assert predict_total_s(pending(4), history, 42.0) == 42.0


def test_a_job_past_its_prediction_still_needs_time():
    job = running(1, (0,), time_limit_s=None, started_at=0.0)
    assert predict_remaining_s(job, 10_000.0, None, 100.0) == pytest.approx(2500.0)


def test_a_job_past_its_prediction_is_never_expected_past_its_time_limit():
    # Declared 1,000 steps of 1 s, still running at 10,000 s: a quarter of that more, but its limit stops it sooner.
    job = running(1, (0,), declared_steps=1000, observed_step_s=1.0, steps_done=1000, steps_reported_at=1000.0,
                  time_limit_s=11_000.0)
    assert predict_remaining_s(job, 10_000.0, None, 100.0) == pytest.approx(1000.0)
    assert predict_remaining_s(job, 11_500.0, None, 100.0) == 0.0


def test_expected_hold_counts_each_run_that_outlasted_the_job_up_to_when_it_is_stopped():
    """Runs of 1..40 minutes: a job that never ran holds its GPUs 20.5 minutes on average if nothing stops it,
    8.875 if it is stopped after 10 (runs of 1..10 minutes, then 30 stopped at 10); one that has run 30 minutes
    and is stopped at 35 has 4 to go (the ten runs past 30: 31..35, and five stopped at 35, less 30). None once no
    run outlasted it, or before the history has enough runs."""
    history = RuntimeHistory()
    assert history.expected_hold_s(0.0, 600.0) is None
    for minutes in range(1, 41):
        history.record("u", "k", FinishedRun(1, minutes * 60.0))
    assert history.expected_hold_s(0.0, float("inf")) == pytest.approx(20.5 * 60)
    assert history.expected_hold_s(0.0, 600.0) == pytest.approx(8.875 * 60)
    assert history.expected_hold_s(1800.0, 2100.0) == pytest.approx(4 * 60)
    assert history.expected_hold_s(41 * 60.0, 10**9) is None
    history.record("u", "k", FinishedRun(1, 3600.0))  # (a new run is counted: the cached sums start again)
    assert history.expected_hold_s(41 * 60.0, 10**9) == pytest.approx(3600.0 - 41 * 60)
