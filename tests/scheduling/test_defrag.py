"""Defragmentation: a gang that the free GPUs hold in number but not in layout moves a few running jobs (defrag.py)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.scheduling.config import PolicyConfig
from apps.scheduling.defrag import MOVED
from apps.scheduling.policy import schedule
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import TraceJob, build_hosts
from apps.scheduling.types import Decisions, PendingJob, Priority, RunningJob, Snapshot, TeamQuotaView

from .helpers import hosts, pending, running, snapshot

CONFIG = PolicyConfig(min_run_before_preempt_s=0.0)
# 4 hosts of 4 GPUs (ids 0-3, 4-7, 8-11, 12-15); one single-GPU job of team "other" on each of the first two.
HOSTS = hosts(4, 4)
QUOTAS = {"t": TeamQuotaView("t", 16), "other": TeamQuotaView("other", 16)}


NOW = 100_000.0


def short(job_id: int, gpu_ids: tuple[int, ...], **kw: object) -> RunningJob:
    """A job of team "other" started 700 s ago with 300 s left: it comes before a gang of hours in the order."""
    kw = {"started_at": NOW - 700.0, "declared_steps": 1_000, "observed_step_s": 1.0, **kw}
    return running(job_id, gpu_ids, team="other", **kw)


def gang(gpus: int, **kw: object) -> PendingJob:
    """Waiting job 1: `gpus` GPUs for 10,000 s."""
    return pending(1, gpus=gpus, **{"declared_steps": 10_000, "observed_step_s": 1.0, **kw})


def scattered(*waiting: PendingJob, on: tuple[int, ...] = (0, 4, 8, 12), **kw: object) -> Snapshot:
    """One short single-GPU job of team "other" on each GPU of `on` (jobs 101, 102, ...), and `waiting`."""
    jobs = [short(101 + n, (gpu,), **kw) for n, gpu in enumerate(on)]
    return snapshot(HOSTS, waiting, jobs, quotas=QUOTAS, now=NOW)


def host_of(gpu_id: int) -> int:
    return gpu_id // 4


def assert_no_gpu_twice(snap: Snapshot, decisions: Decisions) -> None:
    stopped = {p.job_id for p in decisions.preemptions}
    held = [g for job in snap.running if job.job_id not in stopped for g in job.gpu_ids]
    placed = [g for p in decisions.placements for g in p.gpu_ids]
    assert len(held + placed) == len(set(held + placed))


def test_a_gang_that_free_gpus_hold_only_in_number_moves_the_jobs_in_its_way():
    # 12 GPUs free, but no two whole hosts: the 8-GPU gang gets two hosts once their jobs move to the others.
    snap = scattered(gang(8))
    decisions = schedule(snap, CONFIG)
    placed = next(p for p in decisions.placements if p.job_id == 1)
    assert len({host_of(g) for g in placed.gpu_ids}) == 2 and len(placed.gpu_ids) == 8
    moved = {p.job_id for p in decisions.preemptions}
    assert len(moved) == 2 and [p.job_id for p in decisions.placements] == [1]
    assert all(p.for_job == 1 and p.reason == MOVED.format(job=1, gpus=8) and p.moved for p in decisions.preemptions)
    # the moved ones were on the gang's hosts; the others stay where they are
    assert {host_of(j.gpu_ids[0]) for j in snap.running if j.job_id in moved} == {host_of(g) for g in placed.gpu_ids}
    assert not decisions.pending and decisions.wake_at == snap.now  # (a pass again at once: they wait again)
    assert_no_gpu_twice(snap, decisions)
    # The next pass, the moved jobs waiting again, starts them off the gang's hosts.
    left = tuple(j for j in snap.running if j.job_id not in moved)
    gang_job = running(1, placed.gpu_ids)
    waiting = tuple(pending(j.job_id, team="other") for j in snap.running if j.job_id in moved)
    after = schedule(replace(snap, running=(*left, gang_job), pending=waiting), CONFIG)
    assert {p.job_id for p in after.placements} == moved and not after.preemptions


def test_the_plan_moves_the_fewest_gpus():
    # A 4-GPU gang: host 0 holds a 2-GPU job, host 1 a 1-GPU job (and 3 free): host 1's one job moves.
    snap = snapshot(
        HOSTS, [gang(4)], [short(101, (0, 1)), short(102, (4,)), short(103, (8,)), short(104, (12,))],
        quotas=QUOTAS, now=NOW,
    )
    decisions = schedule(snap, CONFIG)
    assert [p.job_id for p in decisions.preemptions] == [102]
    assert {host_of(g) for g in next(p for p in decisions.placements if p.job_id == 1).gpu_ids} == {1}
    assert_no_gpu_twice(snap, decisions)


def test_jobs_in_their_protected_run_are_not_moved():
    snap = scattered(gang(8), started_at=NOW - 60.0)
    decisions = schedule(snap, PolicyConfig(min_run_before_preempt_s=600.0))
    assert not decisions.preemptions and not decisions.placements
    assert decisions.pending[1].code == "gang"


def test_only_jobs_that_come_before_the_gang_in_the_order_are_moved():
    # Waiting again, a moved job must start again before the jobs the gang let pass: it comes before the gang.
    longer = scattered(gang(8), declared_steps=1_000_000)  # days left, x1 GPU: after 10,000 s x 8 GPUs
    assert not schedule(longer, CONFIG).preemptions
    assert schedule(longer, CONFIG).pending[1].code == "gang"
    lower = scattered(gang(8), priority=Priority.LOW)  # short, but of a lower class
    assert not schedule(lower, CONFIG).preemptions
    higher = scattered(gang(8), declared_steps=1_000_000, priority=Priority.HIGH)  # long, but of a higher class
    assert {p.job_id for p in schedule(higher, CONFIG).preemptions} == {101, 102}


def test_a_service_replica_and_a_fraction_stay_where_they_are():
    replica = scattered(gang(8), service_group="svc")
    assert not schedule(replica, CONFIG).preemptions
    fraction = scattered(gang(8), gpu_share=0.5)
    assert not schedule(fraction, CONFIG).preemptions


def test_no_plan_moves_more_than_the_limit():
    # Every host holds one job: an 8-GPU gang needs two of them moved.
    snap = scattered(gang(8))
    assert not schedule(snap, replace(CONFIG, max_defrag_moves=1)).preemptions
    assert len(schedule(snap, replace(CONFIG, max_defrag_moves=2)).preemptions) == 2


def test_a_moved_job_goes_to_free_gpus_off_the_gangs_host():
    # Free: 1-3 on host 0 and 15 on host 3; a 4-GPU gang gets host 0 once job 101 moves to GPU 15.
    snap = snapshot(
        HOSTS, [gang(4)],
        [short(101, (0,)), short(102, (4, 5, 6, 7)), short(103, (8, 9, 10, 11)), short(104, (12, 13, 14))],
        quotas=QUOTAS, now=NOW,
    )
    decisions = schedule(snap, CONFIG)
    assert [p.job_id for p in decisions.preemptions] == [101]
    assert [(p.job_id, p.gpu_ids) for p in decisions.placements] == [(1, (0, 1, 2, 3))]
    assert_no_gpu_twice(snap, decisions)


def test_no_job_is_moved_where_it_would_not_fit():
    # Free: 2-3 on host 0, 9 on host 2, 13 on host 3. Emptying any host for a 4-GPU gang means moving a job of 2
    # or 3 GPUs, and no host has that many free off the gang's: nothing moves, the gang waits.
    snap = snapshot(
        HOSTS, [gang(4)],
        [short(101, (0, 1)), short(102, (4, 5, 6, 7)), short(103, (8, 10, 11)), short(104, (12, 14, 15))],
        quotas=QUOTAS, now=NOW,
    )
    decisions = schedule(snap, CONFIG)
    assert not decisions.preemptions and decisions.pending[1].code == "gang"


def test_off_it_waits_as_before():
    decisions = schedule(scattered(gang(8)), replace(CONFIG, defragment=False))
    assert not decisions.preemptions and decisions.pending[1].code == "gang"


def test_a_gang_beyond_its_quota_moves_nothing():
    snap = scattered(gang(8))
    decisions = schedule(replace(snap, quotas={**QUOTAS, "t": TeamQuotaView("t", 4)}), CONFIG)
    assert not decisions.preemptions


def test_the_simulator_starts_a_moved_job_again_elsewhere():
    # Four single-GPU jobs of 2 h, one per host, then an 8-GPU job of 1 h: it starts at once, two of them move and
    # start again at once (the next pass, at the same moment) on the other hosts.
    jobs = [TraceJob(job_id=n, gpus=1, submit_s=float(n), duration_s=7200.0, model="m", team="t") for n in range(4)]
    jobs.append(TraceJob(job_id=4, gpus=8, submit_s=700.0, duration_s=3600.0, model="m", team="t"))
    quotas = {"t": TeamQuotaView("t", 16)}

    def spread_then_schedule(snap: Snapshot) -> Decisions:
        decisions = schedule(snap, CONFIG)
        if snap.now < 10.0:  # the single-GPU jobs one per host (best fit would pack them on one)
            placements = tuple(replace(p, gpu_ids=(4 * p.job_id,)) for p in decisions.placements)
            decisions = replace(decisions, placements=placements)
        return decisions

    sim = Simulator(jobs, build_hosts(4, 4), spread_then_schedule, quotas, config=CONFIG)
    result = sim.run("console")
    states = {s.trace.job_id: s for s in result.jobs}
    assert states[4].first_start == 700.0
    moved = [s for s in result.jobs if s.trace.job_id != 4 and s.run_start == 700.0]
    assert len(moved) == 2 and result.preemptions == 2
    # A move is no preemption of the job's (Preemption.moved): its count, which raises its protection, stays.
    assert all(s.preemptions == 0 for s in result.jobs)
    assert all(s.finish is not None for s in result.jobs)


@st.composite
def fragmented(draw) -> Snapshot:
    """Hosts of 4 GPUs, each holding short jobs of 1 or 2 GPUs on some of its GPUs, and a waiting gang of 2-8."""
    count = draw(st.integers(2, 5))
    jobs: list[RunningJob] = []
    for host in range(count):
        gpu = 4 * host
        while gpu < 4 * host + 4:
            size = draw(st.sampled_from((0, 1, 1, 2)))
            if size == 0:
                gpu += 1
                continue
            size = min(size, 4 * host + 4 - gpu)
            jobs.append(short(101 + len(jobs), tuple(range(gpu, gpu + size))))
            gpu += size
    quotas = {"t": TeamQuotaView("t", 8), "other": TeamQuotaView("other", 4 * count)}
    return snapshot(hosts(count, 4), [gang(draw(st.integers(2, 8)))], jobs, quotas=quotas, now=NOW)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fragmented())
def test_moves_make_room_and_the_moved_jobs_start_again_at_once(snap: Snapshot):
    decisions = schedule(snap, CONFIG)
    assert_no_gpu_twice(snap, decisions)
    moved = {p.job_id for p in decisions.preemptions}
    assert len(moved) <= CONFIG.max_defrag_moves
    if not moved:
        return
    placed = next(p for p in decisions.placements if p.job_id == 1)
    gang_hosts = {host_of(g) for g in placed.gpu_ids}
    assert len(gang_hosts) == -(-len(placed.gpu_ids) // 4)  # on the fewest hosts
    by_id = {j.job_id: j for j in snap.running}
    # every moved job was in the gang's way, and all of them start again in the next pass
    assert all(set(by_id[m].gpu_ids) & set(placed.gpu_ids) for m in moved)
    left = tuple(j for j in snap.running if j.job_id not in moved)
    waiting = tuple(pending(m, gpus=by_id[m].gpus, team="other") for m in sorted(moved))
    after = schedule(replace(snap, running=(*left, running(1, placed.gpu_ids)), pending=waiting), CONFIG)
    assert {p.job_id for p in after.placements} == moved and not after.preemptions
