"""Start estimates (estimate.py through the console pass): quota waits, minimum run time, no floor, declared steps
and work size, confidence, and a reason that agrees with the position."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from apps.scheduling.config import PolicyConfig
from apps.scheduling.estimate import Release, Waiting, _ranks, estimate_starts, expected_arrivals, start_times
from apps.scheduling.policy import schedule
from apps.scheduling.prediction import FinishedRun, RuntimeHistory, predict_total_s
from apps.scheduling.similarity import similarity_key, work_size
from apps.scheduling.types import Priority, TeamQuotaView

from .helpers import hosts, pending, running, snapshot
from .test_properties import NOW, snapshots

NO_SRPT = PolicyConfig(srpt_preemption=False)


def steps_running(job_id, gpu_ids, now, seconds_left, **kw):
    """A running job that reports 1 step a second with `seconds_left` steps to go."""
    return running(
        job_id,
        gpu_ids,
        declared_steps=1000,
        steps_done=int(1000 - seconds_left),
        observed_step_s=1.0,
        steps_reported_at=now,
        started_at=kw.pop("started_at", now - 1000 + seconds_left),
        **kw,
    )


def test_a_quota_blocked_job_waits_for_its_own_teams_jobs_not_the_others():
    now = 100_000.0
    quotas = {"a": TeamQuotaView("a", 2), "b": TeamQuotaView("b", 4)}
    own = steps_running(10, (0, 1), now, 500, team="a")
    other = steps_running(11, (2, 3), now, 100, team="b")
    snap = snapshot(hosts(1, 6), [pending(1, 2, team="a")], [own, other], quotas, now=now)
    info = schedule(snap, NO_SRPT).pending[1]
    assert info.code == "quota"
    assert info.estimated_start == pytest.approx(now + 500)
    assert info.confidence is not None and 0 < info.confidence <= 1


def test_a_job_wider_than_its_quota_gets_no_estimate():
    quotas = {"a": TeamQuotaView("a", 1)}
    snap = snapshot(hosts(1, 4), [pending(1, 2, team="a")], [], quotas)
    info = schedule(snap, NO_SRPT).pending[1]
    assert info.estimated_start is None


def test_an_urgent_job_is_estimated_when_its_victim_has_run_its_minimum_time():
    now = 100_000.0
    config = PolicyConfig(min_run_before_preempt_s=600)
    young = steps_running(10, (0, 1), now, 10_000, priority=Priority.LOW, started_at=now - 60)
    snap = snapshot(hosts(1, 2), [pending(1, 2, priority=Priority.URGENT)], [young], now=now)
    decisions = schedule(snap, config)
    assert not decisions.placements and not decisions.preemptions
    assert decisions.pending[1].estimated_start == pytest.approx(now + 540)
    # ... a victim preempted often is protected longer (the bar doubles past max_preemptions_per_job: 3 -> 20 min,
    # 5 -> 80 min), and past max_protection_s no longer: the wait is bounded, never to the victim's end.
    for count, protected in ((3, 1200), (5, 4800), (30, 6 * 3600)):
        often = steps_running(
            10, (0, 1), now, 100_000, priority=Priority.LOW, started_at=now - 60, preemption_count=count
        )
        info = schedule(
            snapshot(hosts(1, 2), [pending(1, 2, priority=Priority.URGENT)], [often], now=now), config
        )
        assert info.pending[1].estimated_start == pytest.approx(now + protected - 60)


def test_no_floor_a_job_about_to_end_gives_an_estimate_seconds_away():
    now = 100_000.0
    snap = snapshot(hosts(1, 1), [pending(1)], [steps_running(10, (0,), now, 5)], now=now)
    assert schedule(snap, NO_SRPT).pending[1].estimated_start == pytest.approx(now + 5)


def test_declared_steps_of_the_jobs_ahead_set_the_estimate_behind_them():
    now = 100_000.0
    history = RuntimeHistory()
    history.record("u", "train", FinishedRun(gpus=1, runtime_s=9999.0, step_s=0.5))
    ahead = pending(1, declared_steps=200, similarity_key="train", submitted_at=1.0)  # 100 s
    behind = pending(2, declared_steps=4000, similarity_key="train", submitted_at=2.0)
    snap = snapshot(hosts(1, 1), [ahead, behind], [steps_running(10, (0,), now, 100)], now=now)
    snap = type(snap)(snap.now, snap.hosts, snap.pending, snap.running, snap.quotas, history)
    decisions = schedule(snap, PolicyConfig(ordering="fifo", srpt_preemption=False))
    assert decisions.pending[1].estimated_start == pytest.approx(now + 100)
    assert decisions.pending[2].estimated_start == pytest.approx(now + 200)


def test_work_size_scales_similar_runs():
    short = {"builtin": "mlp-digits", "params": {"epochs": 2, "hidden": 64}}
    long = {"builtin": "mlp-digits", "params": {"epochs": 1000, "hidden": 64, "seed": 3}}
    assert similarity_key(short) == similarity_key(long) == "builtin:mlp-digits hidden=64"
    assert work_size(long) == 1000.0 and work_size({"command": ["python", "x.py"]}) is None
    history = RuntimeHistory()
    for _ in range(3):
        history.record("u", similarity_key(short), FinishedRun(1, 120.0, work=work_size(short)))
    job = pending(1, similarity_key=similarity_key(long), work_size=work_size(long))
    assert predict_total_s(job, history, 1.0) == pytest.approx(60_000.0)


def test_confidence_follows_how_good_past_predictions_were():
    steady, erratic = RuntimeHistory(), RuntimeHistory()
    for i in range(6):
        steady.record("u", "k", FinishedRun(1, 100.0 + i))
        erratic.record("u", "k", FinishedRun(1, 10.0 if i % 2 else 1000.0))
    assert steady.runtime_estimate("u", "k", 1)[1] == 1.0
    assert erratic.runtime_estimate("u", "k", 1)[1] < 0.5


def test_running_jobs_are_stopped_together_for_the_job_their_gpus_let_start():
    """An urgent 2-GPU job may stop two low ones, one after 50 s and one after 100 s (their minimum run time): it
    starts at 100 s, when both together make room. (Stopped one by one, the first went back to its GPU at 50 s,
    the job stopped after it too, and the estimate was the end of their runs, hours later.)"""
    now = 100_000.0
    config = PolicyConfig(min_run_before_preempt_s=600)
    first = steps_running(10, (0,), now, 10_000, priority=Priority.LOW, started_at=now - 550)
    second = steps_running(11, (1,), now, 10_000, priority=Priority.LOW, started_at=now - 500)
    snap = snapshot(hosts(1, 2), [pending(1, 2, priority=Priority.URGENT)], [first, second], now=now)
    decisions = schedule(snap, config)
    assert not decisions.placements and not decisions.preemptions
    assert decisions.pending[1].estimated_start == pytest.approx(now + 100)


@pytest.mark.parametrize(("gang_gpus", "config", "wait_s"), [
    (4, PolicyConfig(min_run_before_preempt_s=600), 100),  # 4x as wide: it stops them once they have run 600 s
    (2, PolicyConfig(min_run_before_preempt_s=600), 10_000),  # 2x only: 1.2x smaller is not enough, their ends
    (4, PolicyConfig(min_run_before_preempt_s=600, gang_preempt_width=0), 10_000),  # the rule off
])
def test_a_wide_declared_gang_is_estimated_to_stop_narrow_declared_jobs_as_the_pass_would(gang_gpus, config,
                                                                                          wait_s):
    """One-GPU jobs with 10,000 declared steps left (one a second) that have run 500 s fill the host; a gang
    declaring 1.2x less GPU-time waits. The pass may stop them for it only if it is gang_preempt_width times as
    wide (preemption.shorter_ratio), once they have run their minimum time: the estimate follows the same rule."""
    now = 100_000.0
    victims = [running(10 + i, (i,), declared_steps=10_500, steps_done=500, observed_step_s=1.0, steps_reported_at=now,
                       started_at=now - 500, submitted_at=now - 500) for i in range(gang_gpus)]
    gang = pending(1, gang_gpus, declared_steps=8_000 // gang_gpus, observed_step_s=1.0, submitted_at=now - 10)
    decisions = schedule(snapshot(hosts(1, gang_gpus), [gang], victims, now=now), config)
    assert not decisions.preemptions
    assert decisions.pending[1].estimated_start == pytest.approx(now + wait_s)
    later = schedule(snapshot(hosts(1, gang_gpus), [gang], victims, now=now + 100), config)  # as the pass then does
    assert len(later.preemptions) == (gang_gpus if wait_s == 100 else 0)


def test_a_running_job_is_expected_to_be_stopped_once_it_moves_on_to_a_longer_queue():
    """Without declarations: half the finished runs took 100 s and half a day. A job that has run 50 s is in the
    first attained-service queue, as short as the waiting job, so no victim now; at 100 s it moves on to a queue
    of day-long runs and may be stopped, once it has run its 600 s: the waiting job's estimate says so, not its
    predicted end."""
    now = 100_000.0
    history = RuntimeHistory()
    for n in range(60):
        history.record("u", "", FinishedRun(1, 100.0 if n % 2 else 86_400.0))
    snap = snapshot(hosts(1, 1), [pending(1, submitted_at=now)], [running(10, (0,), started_at=now - 50)], now=now)
    snap = replace(snap, history=history)
    decisions = schedule(snap, PolicyConfig(min_run_before_preempt_s=600))
    assert not decisions.preemptions
    assert decisions.pending[1].estimated_start == pytest.approx(now + 550)


def test_the_replay_stops_a_job_only_for_one_that_may_stop_it():
    """Told that a running job may be stopped from 10 s on, the replay stops it for a waiting job ranked before it
    that may (the pass's rule, given as may_stop), and not for one that may not."""
    stoppable = Waiting(2, (0, 5.0, 0.0, 2), "a", "u", 1, "x", 100, 90.0, 1.0)
    ends = [Release(100.0, "x", 1, "a", "u", 100, 0.5, stoppable, stop_from=10.0)]
    job = Waiting(1, (0, 1.0, 0.0, 1), "a", "u", 1, "x", 100, 50.0, 1.0)
    free, capacity, room = {"x": 0}, {"x": 1}, {"a": 1000}
    assert start_times(0.0, free, capacity, room, {}, ends, [job])[1] == (10.0, 1.0)
    refuse = start_times(0.0, free, capacity, room, {}, ends, [job], may_stop=lambda job, victim: False)
    assert refuse[1] == (100.0, 0.5)


@pytest.mark.parametrize(("gpus", "short_s"), [(1, 100.0), (3, 100.1)])
def test_a_job_started_in_the_replay_is_stopped_again_once_it_moves_on(gpus, short_s):
    """Without declarations attained service time-slices the queue: the job running now may be stopped at 550 s
    (as above); the first waiting job then starts, moves on to the day-long queue after 100 s of run and may be
    stopped once it has run its 600 s, so the second waiting job is told 1,150 s, not the first's predicted end
    (on trace4 a job at place 34 was told 25 h and started after 31 minutes). A 3-GPU job crosses a floor of
    100.1 s too (floor x 3 / 3 rounds below it)."""
    now = 100_000.0
    history = RuntimeHistory()
    for n in range(60):
        history.record("u", "", FinishedRun(gpus, short_s if n % 2 else 86_400.0))
    waiting = [pending(1, gpus, submitted_at=now - 2), pending(2, gpus, submitted_at=now - 1)]
    snap = snapshot(hosts(1, gpus), waiting, [running(10, tuple(range(gpus)), started_at=now - 50)], now=now)
    decisions = schedule(replace(snap, history=history), PolicyConfig(min_run_before_preempt_s=600))
    assert decisions.pending[1].estimated_start == pytest.approx(now + 550)
    assert decisions.pending[2].estimated_start == pytest.approx(now + 1150)


def _burst_behind(history: RuntimeHistory, program: str, preemptible: bool = True) -> list[float]:
    """Four jobs of `program` that declare nothing, waiting on one GPU behind one that has run 50 s: their
    estimated starts, seconds from now."""
    now = 100_000.0
    waiting = [pending(i, 1, submitted_at=now - 10 + i, similarity_key=program) for i in range(1, 5)]
    ahead = running(10, (0,), started_at=now - 50, similarity_key=program, preemptible=preemptible)
    snap = snapshot(hosts(1, 1), waiting, [ahead], now=now)
    decisions = schedule(replace(snap, history=history), PolicyConfig())
    assert not decisions.preemptions
    return [decisions.pending[i].estimated_start - now for i in range(1, 5)]


def test_a_burst_of_jobs_that_declare_nothing_is_told_how_long_such_jobs_hold_their_gpus():
    """The program's runs took 1 day, 15 minutes, then 60 s (so they foretell its runs badly: similar_sigma over
    MAX_SIMILAR_SIGMA), and its last twenty (the prediction, their median) 60 s. Attained service stops a job once
    it moves on past 60 s and has run its protection (a fifth of the 480 s median run: 96 s), for the next job
    that never ran; so a job holds its GPU min(its run, 96 s): 78 s on average over the runs (30 of 60 s, 30
    stopped at 96 s), and the one running, 50 s in, 28 s more. Told by the median of 60 s, the four waiting jobs
    were told 10, 70, 130 and 190 s (trace4 without declarations: hundreds of jobs of a burst, each said to hold
    its GPU 3 minutes, held it about 20); told by the hold, 28, 106, 184 and 262 s."""
    history = RuntimeHistory()
    for seconds in [86_400.0] * 20 + [900.0] * 10 + [60.0] * 30:
        history.record("u", "k", FinishedRun(1, seconds))
    assert _burst_behind(history, "k") == pytest.approx([28.0, 106.0, 184.0, 262.0])


def test_a_job_that_nothing_may_stop_holds_its_gpus_for_its_prediction():
    """The same runs, but the running job may not be preempted: no stop bounds its hold, and the mean of what the
    runs that outlasted it still needed is a heavy tail's (days, where most end in a minute), so it keeps its
    prediction (60 s, 10 s to go); the waiting jobs, which may be stopped, hold theirs 78 s each."""
    history = RuntimeHistory()
    for seconds in [86_400.0] * 20 + [900.0] * 10 + [60.0] * 30:
        history.record("u", "k", FinishedRun(1, seconds))
    assert _burst_behind(history, "k", preemptible=False) == pytest.approx([10.0, 88.0, 166.0, 244.0])


def test_a_program_whose_runs_foretell_its_runs_keeps_its_prediction_in_the_replay():
    """The same cluster's runs, but the waiting jobs' program always ran 60 s: its runs are believed (as the
    order believes them), each holds its GPU 60 s, and the one running ends in 10."""
    history = RuntimeHistory()
    for seconds in [86_400.0] * 20 + [900.0] * 10:
        history.record("u", "other", FinishedRun(1, seconds))
    for _ in range(30):
        history.record("u", "steady", FinishedRun(1, 60.0))
    assert _burst_behind(history, "steady") == pytest.approx([10.0, 70.0, 130.0, 190.0])


def test_the_replay_stops_a_time_sliced_job_after_its_slice_for_a_job_that_may_stop_it():
    """A job given a slice (Waiting.slice_s, moved_order) runs that long in the replay, then waits again behind the
    job that may stop it; without one, the job behind waits for its whole run."""
    sliced = Waiting(1, (0, 1.0, 0.0, 1), "a", "u", 1, "x", 100, 1000.0, 1.0, slice_s=30.0, moved_order=(0, 9.0, 0.0, 1))
    behind = Waiting(2, (0, 2.0, 0.0, 2), "a", "u", 1, "x", 100, 50.0, 1.0)
    free, capacity, room = {"x": 1}, {"x": 1}, {"a": 1000}
    starts = start_times(0.0, free, capacity, room, {}, [], [sliced, behind])
    assert starts[1] == (0.0, 1.0) and starts[2] == (30.0, 1.0)
    whole = start_times(0.0, free, capacity, room, {}, [], [replace(sliced, slice_s=None, moved_order=None), behind])
    assert whole[2] == (1000.0, 1.0)
    refuse = start_times(0.0, free, capacity, room, {}, [], [sliced, behind], may_stop=lambda job, victim: False)
    assert refuse[2] == (1000.0, 1.0)
    # An expected submission copied from a sliced job is no victim: its moved order is not among the replay's.
    sweep = [replace(sliced, job_id=i, order=(0, 1.0, 10.0 * i, i)) for i in range(12)]
    expected = expected_arrivals(120.0, sweep)
    assert expected and all(job.slice_s is None and job.moved_order is None for _, job in expected)
    # ... nor is one that carries a moved order anyway (the estimate lab's arrival models copy past entries)
    stray = replace(sliced, job_id=99, order=(0, 0.5, 0.0, 99), moved_order=(0, 8.0, 0.0, 99), expected=True)
    assert start_times(0.0, free, capacity, room, {}, [], [behind], [(0.0, stray)])[2] == (1000.0, 1.0)


def test_a_sweep_expected_to_go_on_comes_behind_the_jobs_like_it_waiting_now():
    """Twelve like jobs submitted 10 s apart, up to now, on one busy GPU: a sweep going on, whose like is expected
    again. Aging ranks a like job submitted later behind them, so the last of the twelve is told the end of the
    eleven ahead of it (with their scores now, the copies of the sweep's first jobs went ahead of its later ones:
    on trace4 without declarations the median error went 0.92 -> 0.74 of the wait)."""
    now = 100_000.0
    sweep = [
        pending(i, declared_steps=100, observed_step_s=1.0, submitted_at=now - 10.0 * (12 - i)) for i in range(1, 13)
    ]
    snap = snapshot(hosts(1, 1), sweep, [steps_running(20, (0,), now, 100)], now=now)
    decisions = schedule(snap, NO_SRPT)
    assert [decisions.pending[i].position for i in range(1, 13)] == list(range(1, 13))
    assert decisions.pending[12].estimated_start == pytest.approx(now + 100 + 11 * 100)


def test_the_first_in_the_queue_is_not_told_of_jobs_ahead():
    now = 100_000.0
    snap = snapshot(hosts(1, 1), [pending(1)], [steps_running(10, (0,), now, 50)], now=now)
    info = schedule(snap, NO_SRPT).pending[1]
    assert info.position == 1 and "jobs ahead" not in info.reason and "first in the queue" in info.reason


def test_replay_gives_each_team_its_own_room():
    queue = [
        Waiting(1, (0, 0.0, 0.0, 1), "a", "u", 1, "x", 100, 50.0, 1.0),
        Waiting(2, (0, 0.0, 0.0, 2), "b", "u", 1, "x", 100, 50.0, 1.0),
    ]
    ends = [Release(10.0, "x", 1, "b", "u", 100, 0.5), Release(30.0, "x", 1, "a", "u", 100, 0.8)]
    starts = estimate_starts(0.0, {"x": 0}, {"x": 2}, {"a": 0, "b": 0}, {}, ends, queue)
    assert starts[2] is not None and starts[2].start == 10.0 and starts[2].confidence == 0.5
    assert starts[1] is not None and starts[1].start == 30.0 and starts[1].confidence == 0.8


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_estimates_are_never_in_the_past_and_confidence_is_a_share(snap):
    decisions = schedule(snap)
    for info in decisions.pending.values():
        if info.estimated_start is not None:
            assert info.estimated_start >= NOW - 1e-6
            assert info.confidence is not None and 0.0 <= info.confidence <= 1.0


def test_ranks_of_a_queue_in_order_are_those_of_sorting_all_orders() -> None:
    # (estimate._ranks places a strictly increasing queue without sorting it; equal orders share the last place)
    for seed in range(300):
        rng = random.Random(seed)
        pool = [(-rng.randrange(3), float(rng.randrange(20)), 0.0, rng.randrange(4)) for _ in range(40)]
        queue = sorted(set(rng.sample(pool, rng.randrange(30))))
        others = [rng.choice(pool) for _ in range(rng.randrange(10))] + queue[:1]
        ranks, rank = _ranks(queue, others)
        expected = {order: i for i, order in enumerate(sorted(queue + others))}
        assert ranks == [expected[order] for order in queue]
        assert {order: rank[order] for order in others} == {order: expected[order] for order in others}


def test_the_first_of_each_team_and_class_read_off_a_queue_in_order_are_those_of_the_whole_queue() -> None:
    # (scheduler._firsts walks each class's run of the queue only until it has seen every team asked about)
    from apps.scheduling.scheduler import _firsts

    for seed in range(300):
        rng = random.Random(seed)
        orders = sorted(
            {(-rng.randrange(4), float(rng.randrange(50)), 0.0, rng.randrange(10**6)) for _ in range(rng.randrange(60))}
        )
        queue = [Waiting(o[3], o, rng.choice("abcde"), "u", 1, None, 100, 1.0, 1.0) for o in orders]
        teams = set(rng.sample("abcdef", rng.randrange(7)))
        top_class = {w.team: -w.order[0] for w in reversed(queue)}
        best_score = {(w.team, -w.order[0]): w.order[1] for w in reversed(queue)}
        found_top, found_best = _firsts(queue, teams)
        assert found_top == {t: c for t, c in top_class.items() if t in teams}
        assert found_best == {k: v for k, v in best_score.items() if k[0] in teams}
