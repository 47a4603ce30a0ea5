"""Start estimates with expected submissions (estimate.py): the rest of a burst that goes ahead of a job in the
queue delays it; what goes behind does not; expected jobs get no estimate of their own."""

from __future__ import annotations

import pytest

from apps.scheduling.estimate import (
    BURST_GAP_S,
    MIN_BURST,
    Release,
    Waiting,
    estimate_starts,
    expected_arrivals,
)


def job(job_id: int, score: float, submitted: float, runtime: float = 100.0, gpus: int = 1) -> Waiting:
    return Waiting(job_id, (0, score, submitted, job_id), "a", "u", gpus, "x", 100 * gpus, runtime, 1.0)


def replay(queue, arrivals=(), free=0, ends=None):
    ends = ends if ends is not None else [Release(10.0, "x", 1, "a", "u", 100, 1.0)]
    return estimate_starts(0.0, {"x": free}, {"x": 1}, {"a": 100}, {}, ends, queue, arrivals)


def test_a_shorter_expected_submission_goes_ahead_and_delays_the_job():
    long = job(1, 500.0, 0.0)
    assert replay([long])[1].start == pytest.approx(10.0)
    # one GPU, freed at 10: a shorter job expected at 5 starts first and runs 40 s
    starts = replay([long], [(5.0, job(2, 40.0, 5.0, runtime=40.0))])
    assert starts[1].start == pytest.approx(50.0)
    assert 2 not in starts


def test_a_longer_expected_submission_goes_behind():
    short = job(1, 50.0, 0.0)
    starts = replay([short], [(5.0, job(2, 900.0, 5.0, runtime=900.0))])
    assert starts[1].start == pytest.approx(10.0)


def test_an_expected_submission_after_the_gpus_free_up_does_not_overtake():
    long = job(1, 500.0, 0.0)
    starts = replay([long], [(20.0, job(2, 40.0, 20.0, runtime=40.0))])
    assert starts[1].start == pytest.approx(10.0)


def test_no_burst_no_expected_submissions():
    now = 10_000.0
    assert expected_arrivals(now, []) == []
    assert expected_arrivals(now, [job(1, 1.0, now - 2 * BURST_GAP_S)]) == []
    # one instant's submissions (a batch, all known): nothing more expected
    assert expected_arrivals(now, [job(1, 1.0, now), job(2, 1.0, now)]) == []


def test_a_sweep_is_expected_to_go_on_as_long_again():
    now = 10_000.0
    n = MIN_BURST
    burst = [job(i, float(i), now - 10 * (n - 1 - i)) for i in range(n)]  # one every 10 s, the last now
    older = job(99, 1.0, now - 10 * n - 2 * BURST_GAP_S)  # before a quiet gap: another burst
    expected = expected_arrivals(now, [*burst, older])
    assert len(expected) == n
    lasted = 10 * (n - 1) * (1 + 1 / n)
    at = sorted(at for at, _ in expected)
    assert at == pytest.approx(sorted(j.order[2] + lasted for j in burst))
    for when, copy in expected:
        assert copy.order[2] == when and copy.order[1] in range(n) and copy.order[3] < 0
    # a few jobs minutes apart are no sweep
    assert expected_arrivals(now, burst[-(n - 1):]) == []


def test_the_job_just_submitted_is_delayed_by_the_expected_rest_of_its_burst():
    now = 0.0
    # a sweep of short jobs, then a long one (job 2); job 2 is estimated behind the sweep's expected repeat
    sweep = [job(100 + i, 40.0, now - 60 - i, runtime=4.0) for i in range(MIN_BURST)]
    long = job(2, 500.0, now)
    expected = expected_arrivals(now, [*sweep, long])
    starts = estimate_starts(now, {"x": 0}, {"x": 1}, {"a": 100}, {}, [Release(10.0, "x", 1, "a", "u", 100, 1.0)],
                             [long], expected)
    # the sweep lasted 69 s (11 jobs): its ten short jobs are expected again 75.3 s after each came, from 6.3 s to
    # 15.3 s; the GPU frees at 10 and they take it 4 s each, coming faster than they end: 10 + 10 x 4
    assert starts[2].start == pytest.approx(50.0)
    assert starts[2].confidence == 0.5  # after the end of an expected job: no surer than it is to come
    # a GPU free only after the repeat: it all goes first as well
    ends = [Release(60.0, "x", 1, "a", "u", 100, 1.0)]
    starts = estimate_starts(now, {"x": 0}, {"x": 1}, {"a": 100}, {}, ends, [long], expected)
    assert starts[2].start == pytest.approx(100.0)
    # ... and a GPU free before any of it comes: the job starts then
    ends = [Release(5.0, "x", 1, "a", "u", 100, 1.0)]
    starts = estimate_starts(now, {"x": 0}, {"x": 1}, {"a": 100}, {}, ends, [long], expected)
    assert starts[2].start == pytest.approx(5.0)
