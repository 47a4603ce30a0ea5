"""The order by estimated remaining GPU-time (ordering.estimate_service): declarations weighed by their record,
attained-service queues learned from history, and the pass's guarantees under it (no starvation, quotas,
priorities, no GPU given twice)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.scheduling.config import PolicyConfig
from apps.scheduling.ordering import (
    EMPTY_HISTORY,
    NeverRun,
    estimate_service,
    job_aging_s,
    service_estimate,
    with_learned_aging,
)
from apps.scheduling.policy import schedule
from apps.scheduling.prediction import (
    COLD_THRESHOLDS_S,
    MAX_SIMILAR_SIGMA,
    MIN_SERVICE_HISTORY,
    PRIOR_DECLARATION_SIGMA,
    PRIOR_DECLARATION_WEIGHT,
    FinishedRun,
    RuntimeHistory,
    gittins_remaining,
    learn_queues,
    predict,
    predict_remaining,
)
from apps.scheduling.preemption import protected_run_s, with_learned_protection
from apps.scheduling.simulate import team_quotas
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import TraceJob, build_hosts, load_trace, with_declarations
from apps.scheduling.types import Snapshot

from .helpers import hosts, pending, running, snapshot
from .test_properties import after, snapshots


def test_queues_are_learned_from_finished_jobs_and_cold_start_on_tiresias_thresholds():
    cold = learn_queues([100.0] * (MIN_SERVICE_HISTORY - 1), (0.5,))
    assert [q.floor for q in cold] == [0.0, *COLD_THRESHOLDS_S]
    services = sorted([10.0] * 50 + [1000.0] * 40 + [100_000.0] * 10)
    queues = learn_queues(services, (0.5, 0.9))
    assert [q.floor for q in queues] == [0.0, 1000.0]  # the 90 % quantile is the last value: no queue past it
    # A fresh job is worth about the small jobs' size; one that got past them about what the others still need.
    assert queues[0].log_remaining < queues[1].log_remaining


def test_young_queues_are_worth_their_gittins_index_and_old_ones_their_mean():
    # Half the runs end at once; of the rest, most end soon after the median and a few run very long.
    run_times = sorted([10.0] * 50 + [1_000.0] * 5 + [1_010.0] * 40 + [1_000_000.0] * 5)
    queues = learn_queues(run_times, (0.25, 0.5))
    assert [q.floor for q in queues] == [0.0, 10.0, 1_000.0]
    # Below the median (1,000 s): what a young job is worth trying.
    assert math.exp(queues[0].log_remaining) == pytest.approx(gittins_remaining([max(t, 1.0) for t in run_times]))
    # From the median on: what the runs past it still needed on average, the very long ones included (their
    # Gittins index, about 10 s more, would put a job that has run 1,000 s ahead of every fresh one).
    past = [t - 1_000.0 for t in run_times if t > 1_000.0]
    assert math.exp(queues[2].log_remaining) == pytest.approx(sum(past) / len(past))
    assert queues[2].log_remaining > queues[0].log_remaining


def test_a_gang_goes_by_its_age_and_weighs_as_its_gpus():
    history = RuntimeHistory()
    for i in range(40):
        history.record("u", "m", FinishedRun(1, 10.0 ** (1 + i % 5), None))
    single = running(1, (0,), started_at=0.0)
    gang = running(2, tuple(range(1, 33)), started_at=0.0)
    one, wide = (estimate_service(job, 500.0, history) for job in (single, gang))
    assert one.queue == wide.queue > 0  # both have run 500 s
    assert wide.remaining_gpu_s == pytest.approx(32 * one.remaining_gpu_s)
    assert wide.next_floor == pytest.approx(32 * one.next_floor)


def test_gittins_remaining_favours_a_likely_quick_finish():
    assert gittins_remaining([5.0]) == 5.0
    # Nine in ten finish after 1 more: worth trying 1, whatever the rare long one needs.
    assert gittins_remaining([1.0] * 9 + [1e6]) == pytest.approx(10 / 9)


def _history(declared_factor: float, runs: int = 30) -> RuntimeHistory:
    history = RuntimeHistory()
    for i in range(runs):
        steps = 1000 + 37 * i
        history.record(
            "u",
            "m",
            FinishedRun(1, float(steps), 1.0, declared_steps=max(1, round(steps / declared_factor)), steps=steps),
        )
    return history


def test_a_declaration_weighs_as_far_as_its_user_has_been_right():
    # (a program of its own: the history's runs of "m" would be its similar runs, weighed beside the declaration)
    job = pending(1, declared_steps=50_000, observed_step_s=1.0, similarity_key="new")
    honest = estimate_service(job, 0.0, _history(1.0)).remaining_gpu_s
    assert honest == pytest.approx(50_000, rel=0.1)
    # The same declaration from a user whose declarations were 10x off says less: the estimate leans on history.
    wrong = estimate_service(job, 0.0, _history(10.0)).remaining_gpu_s
    assert abs(math.log(wrong / 50_000)) > abs(math.log(honest / 50_000)) + 0.5


def test_a_job_past_its_declaration_still_needs_time():
    history = _history(1.0)
    job = running(1, (0,), declared_steps=100, steps_done=100, observed_step_s=1.0, started_at=0.0,
                  similarity_key="other")
    estimate = estimate_service(job, 5000.0, history)
    assert estimate.queue > 0 and estimate.remaining_gpu_s > 1.0


def _program_history(runtimes: list[float], key: str) -> RuntimeHistory:
    """A history of runs of program `key` (of the given run times, 1 GPU, nothing declared) beside 40 runs of
    other programs spread over 1 s .. 100,000 s, for the attained-service queues."""
    history = RuntimeHistory()
    for i in range(40):
        history.record("u", f"other{i % 5}", FinishedRun(1, 10.0 ** (i % 6), None))
    for runtime in runtimes:
        history.record("u", key, FinishedRun(1, runtime, None))
    return history


def test_similar_runs_order_a_job_as_far_as_they_have_foretold_its_program():
    fresh = pending(1, similarity_key="m")
    # A program whose runs repeat (every run 50,000 s): similar runs foretold each one, and set the order.
    steady = _program_history([50_000.0] * 12, "m")
    assert steady.similar_sigma("m") < MAX_SIMILAR_SIGMA
    assert estimate_service(fresh, 0.0, steady).remaining_gpu_s == pytest.approx(50_000, rel=0.2)
    # A program whose runs span five orders of magnitude (as a model name in the Muri traces): its similar runs
    # agree with each other at times (a few alike in a row) but foretold the next run badly, so the order falls
    # back to attained service alone (2D-LAS over the learned queues): the same estimate as a job with no history.
    erratic = _program_history([10.0 ** (1 + (i * 7) % 5) for i in range(12)] + [80_000.0] * 3, "m")
    assert erratic.similar_sigma("m") > MAX_SIMILAR_SIGMA
    assert erratic.similar_remaining("u", "m", 1, 0.0) is not None
    no_similar = estimate_service(pending(2, similarity_key="never-ran"), 0.0, erratic)
    assert estimate_service(fresh, 0.0, erratic).remaining_gpu_s == pytest.approx(no_similar.remaining_gpu_s)


def test_similar_runs_weigh_beside_a_declaration_as_far_as_each_has_been_right():
    # A program whose runs repeat (50,000 s each), submitted by a user whose declarations have been off by a factor
    # of ten either way at random (on another program): it declares 5,000 s of steps, and the order believes its
    # runs, not the declaration.
    history = _program_history([50_000.0] * 12, "m")
    for n in range(30):
        history.record("u", "other", FinishedRun(1, 1000.0, 1.0, declared_steps=100 if n % 2 else 10_000, steps=1000))
    assert history.declaration_sigma("u") > 2.0 and history.similar_sigma("m") < 0.5
    assert history.declared_scale("u") == pytest.approx(1.0)
    job = pending(1, similarity_key="m", declared_steps=5_000, observed_step_s=1.0)
    assert estimate_service(job, 0.0, history).remaining_gpu_s == pytest.approx(50_000, rel=0.2)
    # (the pass's shortcut for a job that never ran gives the same figure)
    assert NeverRun(history).figures(job, 3600.0)[2] == pytest.approx(estimate_service(job, 0.0, history).remaining_gpu_s)


def test_a_users_steady_overstatement_is_taken_off_their_declarations():
    # A user who always declares three times the steps they run (as HPC users ask for their time limits): their
    # declarations are believed a third, as surely as they have been steady; iid errors average out.
    history = RuntimeHistory()
    for _ in range(20):
        history.record("u", "other", FinishedRun(1, 1000.0, 1.0, declared_steps=3000, steps=1000))
    shrunk = math.exp(-math.log(3.0) * 20 / (20 + PRIOR_DECLARATION_WEIGHT))  # (toward no bias while few)
    assert history.declared_scale("u") == pytest.approx(shrunk)
    assert history.declaration_sigma("u") < 0.5 * PRIOR_DECLARATION_SIGMA
    job = pending(1, declared_steps=9_000, observed_step_s=1.0)
    assert predict(job, history, 3600.0).total_s == pytest.approx(9_000 * shrunk)
    assert estimate_service(job, 0.0, history).remaining_gpu_s == pytest.approx(9_000 * shrunk, rel=0.05)
    assert NeverRun(history).figures(job, 3600.0)[0] == pytest.approx(9_000 * shrunk)
    # a user with no record is believed as declared
    assert predict(replace(job, user="new"), history, 3600.0).total_s == 9_000


def test_one_run_of_the_same_gpu_count_is_a_similar_run_and_other_counts_need_three():
    history = RuntimeHistory()
    # (cifar10 in Pollux's workloads: its run time depends on its GPU count; 8 GPUs ran once, in 6,000 s)
    for gpus, runtime in ((4, 12_000.0), (4, 13_000.0), (16, 9_000.0), (8, 6_000.0)):
        history.record("u", "cifar10", FinishedRun(gpus, runtime, None))
    log_remaining, spread = history.similar_remaining("v", "cifar10", 8, 0.0)
    assert math.exp(log_remaining) == pytest.approx(6_000.0)
    # (how far to believe one run is the program's record, similar_sigma, which the order weighs by)
    assert spread < history.similar_sigma("cifar10")
    # a job that has outlasted the one 8-GPU run, or one of a GPU count never run: runs of every count (four)
    assert math.exp(history.similar_remaining("v", "cifar10", 8, 6_600.0)[0]) == pytest.approx(5_400.0)
    assert math.exp(history.similar_remaining("v", "cifar10", 2, 0.0)[0]) == pytest.approx(math.sqrt(9e3 * 12e3))
    # ... but not fewer than three of them
    sparse = RuntimeHistory()
    for gpus, runtime in ((4, 12_000.0), (16, 9_000.0)):
        sparse.record("u", "cifar10", FinishedRun(gpus, runtime, None))
    assert sparse.similar_remaining("v", "cifar10", 2, 0.0) is None
    assert sparse.similar_remaining("v", "cifar10", 4, 0.0) is not None


@st.composite
def histories(draw) -> RuntimeHistory:
    history = RuntimeHistory()
    for _ in range(draw(st.integers(0, 40))):
        steps = draw(st.integers(1, 100_000))
        declared = draw(st.one_of(st.none(), st.integers(1, 100_000)))
        history.record(
            draw(st.sampled_from(("u", "v"))),
            "m",
            FinishedRun(draw(st.integers(1, 4)), float(steps), 1.0, declared_steps=declared, steps=steps),
        )
    return history


@st.composite
def snapshots_with_history(draw) -> Snapshot:
    snap = draw(snapshots())
    pending_jobs = tuple(
        replace(j, attained_gpu_seconds=draw(st.sampled_from((0.0, 5e3, 5e5))), similarity_key="m")
        for j in snap.pending
    )
    return replace(snap, pending=pending_jobs, history=draw(histories()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots_with_history())
def test_the_pass_under_the_learned_order_keeps_gpus_quotas_and_priorities(snap: Snapshot):
    decisions = schedule(snap, PolicyConfig())
    config = with_learned_protection(PolicyConfig(), snap.history)  # (the protection the pass ran with)
    _, team_guaranteed = after(snap, decisions)  # asserts no GPU given twice
    for team, held in team_guaranteed.items():
        assert held <= snap.quotas[team].max_gpus
    for p in decisions.preemptions:
        victim = next(r for r in snap.running if r.job_id == p.job_id)
        for_job = next((j for j in snap.pending if j.job_id == p.for_job), None)
        if for_job is None or victim.borrowing and victim.team != for_job.team:
            continue  # a budget stop, or a reclaim (borrowing was the deal)
        # Priorities hold: never stopped for a lower class, and never inside its protected run time.
        assert for_job.team == victim.team and for_job.priority >= victim.priority
        assert snap.now - victim.started_at >= protected_run_s(victim.preemption_count, config)
    for estimate in (estimate_service(j, snap.now, snap.history) for j in snap.pending):
        assert 0 < estimate.remaining_gpu_s < math.inf


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 60), st.integers(0, 400), st.floats(1.0, 1e9), st.integers(1, 8))
def test_the_protection_rises_with_preemptions_and_expires(count: int, run_s: int, ceiling: float, free: int):
    config = PolicyConfig(max_preemptions_per_job=free, max_protection_s=ceiling)
    protection = protected_run_s(count, config)
    assert config.min_run_before_preempt_s <= protection <= max(ceiling, config.min_run_before_preempt_s)
    assert protected_run_s(count + 1, config) >= protection


def history_of_runs(seconds: float, count: int) -> RuntimeHistory:
    history = RuntimeHistory()
    for _ in range(count):
        history.record("u", "train.py", FinishedRun(gpus=1, runtime_s=seconds))
    return history


def test_the_protection_is_no_longer_than_a_fifth_of_the_clusters_median_run():
    config = PolicyConfig()
    assert config.min_run_before_preempt_s == 600 and config.min_run_median_fraction == 0.2
    # Runs of 5 minutes: a job is protected for a minute, not ten.
    short = with_learned_protection(config, history_of_runs(300.0, MIN_SERVICE_HISTORY))
    assert short.min_run_before_preempt_s == pytest.approx(60.0)
    assert protected_run_s(0, short) == pytest.approx(60.0)
    # Hour-long runs, too few runs to tell, no history, or the rule turned off: the configured ten minutes.
    assert with_learned_protection(config, history_of_runs(3600.0, MIN_SERVICE_HISTORY)) is config
    assert with_learned_protection(config, history_of_runs(300.0, MIN_SERVICE_HISTORY - 1)) is config
    assert with_learned_protection(config, None) is config
    off = replace(config, min_run_median_fraction=0.0)
    assert with_learned_protection(off, history_of_runs(300.0, MIN_SERVICE_HISTORY)) is off
    # Runs of seconds (smoke tests from CI): still a minute, what a restart costs, not a second.
    tiny = with_learned_protection(config, history_of_runs(5.0, MIN_SERVICE_HISTORY))
    assert tiny.min_run_before_preempt_s == config.min_run_floor_s == 60.0
    # A configured minimum below the floor stays as configured.
    none_configured = replace(config, min_run_before_preempt_s=0.0)
    assert with_learned_protection(none_configured, history_of_runs(5.0, MIN_SERVICE_HISTORY)) is none_configured


@pytest.mark.parametrize(("run_s", "stopped"), [(300.0, True), (3600.0, False)])
def test_a_short_job_stops_a_long_one_after_a_fifth_of_the_clusters_median_run(run_s: float, stopped: bool):
    """Two minutes into its run a long job is past the protection of a cluster of 5-minute runs (1 min), not of
    one of hour-long runs (10 min): a job ten times shorter of its team and class takes its GPU in the first."""
    now = 100_000.0
    long_job = running(1, (0,), started_at=now - 120, declared_steps=10_000, observed_step_s=1.0, steps_done=120)
    short_job = pending(2, declared_steps=30, observed_step_s=1.0, submitted_at=now - 10)
    snap = replace(snapshot(hosts(1, 1), [short_job], [long_job], now=now),
                   history=history_of_runs(run_s, MIN_SERVICE_HISTORY))
    decisions = schedule(snap, PolicyConfig())
    assert [(p.job_id, p.for_job) for p in decisions.preemptions] == ([(1, 2)] if stopped else [])


def test_the_aging_is_no_longer_than_four_and_a_half_of_the_clusters_long_runs():
    config = PolicyConfig()
    assert config.aging_s == 10 * 24 * 3600 and config.aging_long_run_multiple == 4.5

    def snap_with(run_s: float, count: int = MIN_SERVICE_HISTORY, running_jobs=()) -> Snapshot:
        return replace(snapshot(hosts(1, 8), [], running_jobs), history=history_of_runs(run_s, count))

    # Runs of 50 minutes: waiting 3.75 hours halves a job's score, not ten days.
    assert with_learned_aging(config, snap_with(3000.0)).aging_s == pytest.approx(13_500.0)
    # Runs of three days, too few runs to tell, no history, or the rule turned off: the configured ten days.
    assert with_learned_aging(config, snap_with(3 * 86_400.0)) is config
    assert with_learned_aging(config, snap_with(3000.0, MIN_SERVICE_HISTORY - 1)) is config
    assert with_learned_aging(config, snapshot(hosts(1, 8))) is config
    off = replace(config, aging_long_run_multiple=0.0)
    assert with_learned_aging(off, snap_with(3000.0)) is off
    # Running jobs count with what they have run so far: long runs that have not finished yet (early in a
    # cluster's life) keep the aging long.
    long_runs = [running(i, (i,), started_at=100_000.0 - 36_000.0) for i in range(5)]
    assert with_learned_aging(config, snap_with(3000.0, running_jobs=long_runs)).aging_s == pytest.approx(162_000.0)
    # Runs of seconds (CI smoke tests): an hour at least.
    assert with_learned_aging(config, snap_with(5.0)).aging_s == config.aging_floor_s == 3600.0


@pytest.mark.parametrize(("run_s", "first"), [(3000.0, 1), (3 * 86_400.0, 2)])
def test_a_job_waiting_two_days_goes_first_where_runs_last_an_hour_not_where_they_last_days(run_s: float, first: int):
    """A job declaring 3x the steps of a fresh one, waiting for two days: where the cluster's runs last 50
    minutes that wait counts (aging 3.75 h, six times that for jobs that declare steps) and it takes the one GPU;
    where they last three days it does not (the configured ten days)."""
    now = 1_000_000.0
    waited = pending(1, declared_steps=6_000, observed_step_s=1.0, submitted_at=now - 2 * 86_400)
    fresh = pending(2, declared_steps=2_000, observed_step_s=1.0, submitted_at=now - 10)
    snap = replace(snapshot(hosts(1, 1), [waited, fresh], now=now), history=history_of_runs(run_s, MIN_SERVICE_HISTORY))
    assert [p.job_id for p in schedule(snap, PolicyConfig()).placements] == [first]


@settings(max_examples=6, deadline=None)
@given(
    st.sampled_from(("exact", "noisy", "none")),
    st.floats(1800.0, 3600.0),
    st.floats(10 * 3600.0, 40 * 3600.0),
)
def test_no_starvation_a_long_gang_starts_under_a_stream_of_short_jobs(mode: str, short_s: float, long_s: float):
    """Two GPUs kept busy by a stream of 1-GPU jobs for 8 days: a 2-GPU job submitted first still starts within
    them (aging), whatever it declares."""
    horizon = 8 * 24 * 3600.0
    stream = [
        TraceJob(i, 1, i * short_s / 2, short_s, "short", iterations=int(short_s), step_s=1.0)
        for i in range(1, int(horizon / (short_s / 2)))
    ]
    gang = TraceJob(0, 2, 0.0, long_s, "long", iterations=int(long_s), step_s=1.0)
    jobs = with_declarations([gang, *stream], mode, seed=3)
    config = PolicyConfig(aging_s=900.0)
    sim = Simulator(jobs, build_hosts(1, 2), lambda snap: schedule(snap, config), team_quotas(jobs, 2), config=config)
    gang_state = next(s for s in sim.run("console").jobs if s.trace.job_id == 0)
    assert gang_state.first_start is not None and gang_state.first_start < horizon


def test_trace_declarations_column_and_modes(tmp_path):
    header = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval,iteration_time,declared_iterations\n"
    path = tmp_path / "t.csv"
    path.write_text(header + "0,1,0,100,m,100000,0,1000,250\n1,1,0,100,m,100000,0,1000,\n")
    jobs = load_trace(path, "muri")
    assert [j.declared_steps for j in jobs] == [250, None] and [j.iterations for j in jobs] == [100, 100]
    # Without the column every job declares its truth.
    path.write_text(header.replace(",declared_iterations", "") + "0,1,0,100,m,100000,0,1000\n")
    assert load_trace(path, "muri")[0].declared_steps == 100

    many = [TraceJob(i, 1, 0.0, 10.0, "m", iterations=1000) for i in range(1000)]
    assert all(j.declared_steps == 1000 for j in with_declarations(many, "exact"))
    assert all(j.declared_steps is None for j in with_declarations(many, "none"))
    partial = with_declarations(many, "partial", seed=1)
    assert 0.25 < sum(j.declared_steps is None for j in partial) / len(many) < 0.35
    assert partial == with_declarations(many, "partial", seed=1)  # seeded
    noisy = [math.log(j.declared_steps / 1000) for j in with_declarations(many, "noisy")]  # type: ignore[operator]
    assert 0.9 < math.sqrt(sum(x * x for x in noisy) / len(noisy)) < 1.1


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.none(), histories()),
    st.lists(
        st.tuples(
            st.integers(1, 16),
            st.sampled_from((1.0, 0.5, 0.25)),
            st.one_of(st.none(), st.integers(1, 100_000)),
            st.integers(0, 200_000),
            st.one_of(st.none(), st.floats(0.01, 10.0)),
            st.sampled_from((None, "m", "other")),
            st.sampled_from(("u", "v", "w")),
            st.one_of(st.none(), st.sampled_from((1, 3600.0, 86_400.0, 1e7))),
            st.one_of(st.none(), st.sampled_from((2.0, 50.0))),
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from((3600.0, 7200)),
)
def test_the_pass_figures_of_never_run_jobs_are_their_prediction_and_order(history, jobs, default_s):
    # (NeverRun.figures: predict_remaining and service_estimate of a job that has run 0 s, the same figures and types)
    never_run = NeverRun(history or EMPTY_HISTORY)
    for job_id, (gpus, share, declared, done, step, key, user, limit, work) in enumerate(jobs):
        job = pending(
            job_id, gpus if share == 1.0 else 1, gpu_share=share, declared_steps=declared, steps_done=done,
            observed_step_s=step, similarity_key=key, user=user, time_limit_s=limit, work_size=work,
        )
        expected = (
            *predict_remaining(job, 0.0, history, default_s),
            service_estimate(job, 0.0, history or EMPTY_HISTORY)[0],
        )
        figures = never_run.figures(job, default_s)
        assert figures == expected
        assert [type(x) for x in figures] == [type(x) for x in expected]


def test_biased_declarations_come_from_four_users_each_off_by_a_factor_of_their_own():
    jobs = [TraceJob(job_id=n, gpus=1, submit_s=0.0, duration_s=100.0, model="m", iterations=10_000) for n in range(400)]
    declared = with_declarations(jobs, "biased", seed=3)
    for user, bias in enumerate((0.5, 1.0, 2.0, 4.0)):
        ratios = [j.declared_steps / j.iterations for j in declared if j.user == f"user{user}"]
        assert len(ratios) == 100
        # (the median of a lognormal factor of spread 0.5 over 100 draws stays within 20 % of 1)
        assert statistics.median(ratios) == pytest.approx(bias, rel=0.2)


@pytest.mark.parametrize(("done", "first"), [(2_000, 2), (8_000, 1)])
def test_a_declared_job_goes_by_its_whole_size_until_40_percent_of_it_is_left(done: int, first: int):
    """Two waiting jobs of one user, one GPU: job 1 declared 10,000 steps and ran `done` of them before it was
    preempted, job 2 declares 9,000 and never ran (one step a second each). Shortest job first by declared size:
    job 2 (9,000 s) goes ahead of job 1 (10,000 s) while job 1 has more than 40 % of its steps left (8,000 of
    them, which shortest-remaining would put first), and behind it once job 1 is within 40 % of its end (2,000
    left: valued 5,000 s)."""
    now = 1_000_000.0
    preempted = pending(
        1, declared_steps=10_000, steps_done=done, observed_step_s=1.0, attained_gpu_seconds=float(done),
        preemption_count=1, submitted_at=now - 20_000,
    )
    fresh = pending(2, declared_steps=9_000, observed_step_s=1.0, submitted_at=now - 20_000)
    snap = snapshot(hosts(1, 1), [preempted, fresh], now=now)
    assert [p.job_id for p in schedule(snap, PolicyConfig()).placements] == [first]
    declared = service_estimate(preempted, now, RuntimeHistory())[0]
    assert declared == pytest.approx(10_000.0) if done == 2_000 else declared < 9_000.0


def test_a_job_that_declares_steps_ages_slower_in_the_order_by_size():
    """The aging time of a job that declares steps is declared_aging_multiple times the pass's under the order by
    size, and the pass's own under fair share or FIFO (which do not order by size)."""
    config = PolicyConfig(aging_s=1000.0, declared_aging_multiple=3.0)
    declares, silent = pending(1, declared_steps=100), pending(2)
    assert job_aging_s(declares, config) == 3000.0
    assert job_aging_s(silent, config) == 1000.0
    for ordering in ("fair-share", "fifo"):
        assert job_aging_s(declares, replace(config, ordering=ordering)) == 1000.0
