"""Defragmentation: a gang that the free GPUs hold in number but not in layout moves a few running jobs (defrag.py)."""

from __future__ import annotations

from dataclasses import replace

from apps.scheduling.config import PolicyConfig
from apps.scheduling.defrag import MOVED
from apps.scheduling.policy import schedule
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import TraceJob, build_hosts
from apps.scheduling.types import Decisions, PendingJob, Priority, Snapshot, TeamQuotaView

from .helpers import hosts, pending, running, snapshot

CONFIG = PolicyConfig(min_run_before_preempt_s=0.0)
# 4 hosts of 4 GPUs (ids 0-3, 4-7, 8-11, 12-15); one single-GPU job of team "other" on each of the first two.
HOSTS = hosts(4, 4)
QUOTAS = {"t": TeamQuotaView("t", 16), "other": TeamQuotaView("other", 16)}


def scattered(*waiting: PendingJob, on: tuple[int, ...] = (0, 4, 8, 12), **kw: object) -> Snapshot:
    """One single-GPU job of team "other" on each GPU of `on` (jobs 101, 102, ...), and `waiting`."""
    jobs = [running(101 + n, (gpu,), team="other", **kw) for n, gpu in enumerate(on)]
    return snapshot(HOSTS, waiting, jobs, quotas=QUOTAS)


def host_of(gpu_id: int) -> int:
    return gpu_id // 4


def assert_no_gpu_twice(snap: Snapshot, decisions: Decisions) -> None:
    stopped = {p.job_id for p in decisions.preemptions}
    held = [g for job in snap.running if job.job_id not in stopped for g in job.gpu_ids]
    placed = [g for p in decisions.placements for g in p.gpu_ids]
    assert len(held + placed) == len(set(held + placed))


def test_a_gang_that_free_gpus_hold_only_in_number_moves_the_jobs_in_its_way():
    # 12 GPUs free, but no two whole hosts: the 8-GPU gang gets two hosts once their jobs move to the others.
    snap = scattered(pending(1, gpus=8))
    decisions = schedule(snap, CONFIG)
    gang = next(p for p in decisions.placements if p.job_id == 1)
    assert len({host_of(g) for g in gang.gpu_ids}) == 2 and len(gang.gpu_ids) == 8
    moved = {p.job_id for p in decisions.preemptions}
    assert len(moved) == 2
    assert all(p.for_job == 1 and p.reason == MOVED.format(job=1, gpus=8) for p in decisions.preemptions)
    # each moved job starts again at once, off the gang's hosts; the others stay where they are
    again = {p.job_id: p.gpu_ids for p in decisions.placements if p.job_id in moved}
    assert set(again) == moved
    assert all(host_of(g) not in {host_of(x) for x in gang.gpu_ids} for ids in again.values() for g in ids)
    assert not decisions.pending
    assert_no_gpu_twice(snap, decisions)


def test_the_plan_moves_the_fewest_gpus():
    # A 4-GPU gang: host 0 holds a 2-GPU job, host 1 a 1-GPU job (and 3 free): host 1's one job moves.
    snap = snapshot(
        HOSTS, [pending(1, gpus=4)],
        [running(101, (0, 1), team="other"), running(102, (4,), team="other"), running(103, (8,), team="other"),
         running(104, (12,), team="other")],
        quotas=QUOTAS,
    )
    decisions = schedule(snap, CONFIG)
    assert [p.job_id for p in decisions.preemptions] == [102]
    assert {host_of(g) for g in next(p for p in decisions.placements if p.job_id == 1).gpu_ids} == {1}
    assert_no_gpu_twice(snap, decisions)


def test_jobs_in_their_protected_run_are_not_moved():
    snap = scattered(pending(1, gpus=8), started_at=100_000.0 - 60.0)
    decisions = schedule(snap, PolicyConfig(min_run_before_preempt_s=600.0))
    assert not decisions.preemptions and not decisions.placements
    assert decisions.pending[1].code == "gang"


def test_jobs_of_a_higher_class_are_not_moved_for_a_lower_one():
    decisions = schedule(scattered(pending(1, gpus=8), priority=Priority.HIGH), CONFIG)
    assert not decisions.preemptions and decisions.pending[1].code == "gang"
    decisions = schedule(scattered(pending(1, gpus=8, priority=Priority.URGENT), priority=Priority.HIGH), CONFIG)
    assert {p.job_id for p in decisions.preemptions} == {101, 102}


def test_a_service_replica_and_a_fraction_stay_where_they_are():
    replica = scattered(pending(1, gpus=8), service_group="svc")
    assert not schedule(replica, CONFIG).preemptions
    fraction = scattered(pending(1, gpus=8), gpu_share=0.5)
    assert not schedule(fraction, CONFIG).preemptions


def test_no_plan_moves_more_than_the_limit():
    # Every host holds one job: an 8-GPU gang needs two of them moved.
    snap = scattered(pending(1, gpus=8))
    assert not schedule(snap, replace(CONFIG, max_defrag_moves=1)).preemptions
    assert len(schedule(snap, replace(CONFIG, max_defrag_moves=2)).preemptions) == 2


def test_a_moved_job_goes_to_free_gpus_off_the_gangs_host():
    # Free: 1-3 on host 0 and 15 on host 3; a 4-GPU gang gets host 0 once job 101 moves to GPU 15.
    snap = snapshot(
        HOSTS, [pending(1, gpus=4)],
        [running(101, (0,), team="other"), running(102, (4, 5, 6, 7), team="other"),
         running(103, (8, 9, 10, 11), team="other"), running(104, (12, 13, 14), team="other")],
        quotas=QUOTAS,
    )
    decisions = schedule(snap, CONFIG)
    assert [p.job_id for p in decisions.preemptions] == [101]
    assert next(p for p in decisions.placements if p.job_id == 101).gpu_ids == (15,)
    assert next(p for p in decisions.placements if p.job_id == 1).gpu_ids == (0, 1, 2, 3)
    assert_no_gpu_twice(snap, decisions)


def test_no_job_is_moved_where_it_would_not_fit():
    # Free: 2-3 on host 0, 9 on host 2, 13 on host 3. Emptying any host for a 4-GPU gang means moving a job of 2
    # or 3 GPUs, and no host has that many free off the gang's: nothing moves, the gang waits.
    snap = snapshot(
        HOSTS, [pending(1, gpus=4)],
        [running(101, (0, 1), team="other"), running(102, (4, 5, 6, 7), team="other"),
         running(103, (8, 10, 11), team="other"), running(104, (12, 14, 15), team="other")],
        quotas=QUOTAS,
    )
    decisions = schedule(snap, CONFIG)
    assert not decisions.preemptions and decisions.pending[1].code == "gang"


def test_off_it_waits_as_before():
    decisions = schedule(scattered(pending(1, gpus=8)), replace(CONFIG, defragment=False))
    assert not decisions.preemptions and decisions.pending[1].code == "gang"


def test_a_gang_beyond_its_quota_moves_nothing():
    snap = scattered(pending(1, gpus=8))
    decisions = schedule(replace(snap, quotas={**QUOTAS, "t": TeamQuotaView("t", 4)}), CONFIG)
    assert not decisions.preemptions


def test_the_simulator_runs_a_moved_job_on_at_once_elsewhere():
    # Four single-GPU jobs of 2 h, one per host, then an 8-GPU job of 1 h: it starts at once, two of them move.
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
    assert sum(s.preemptions for s in result.jobs) == 2 and result.migrations == 2
    assert all(s.finish is not None for s in result.jobs)
