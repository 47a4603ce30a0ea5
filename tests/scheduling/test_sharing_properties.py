"""Invariants of one pass over random snapshots with fractions of GPUs."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.sharing import FULL, held_units, is_fractional, share_units
from apps.scheduling.types import GpuView, HostView, PendingJob, Priority, RunningJob, Snapshot, TeamQuotaView

TEAMS = ("a", "b")
NOW = 1_000_000.0
SHARES = (0.25, 0.5, 0.33, 0.75, 0.1)


@st.composite
def shared_snapshots(draw) -> Snapshot:
    host_views, gpu_id = [], 0
    for h in range(draw(st.integers(1, 3))):
        gpus = []
        for index in range(draw(st.integers(1, 4))):
            memory = draw(st.sampled_from((0, 40_000)))
            gpus.append(GpuView(gpu_id, index, "x", schedulable=draw(st.integers(0, 6)) > 0, memory_mb=memory))
            gpu_id += 1
        host_views.append(HostView(f"h{h}", tuple(gpus)))
    quotas = {t: TeamQuotaView(t, draw(st.integers(1, 8)), may_borrow=draw(st.booleans())) for t in TEAMS}
    memory_of = {g.gpu_id: g.memory_mb for h in host_views for g in h.gpus}
    room = dict.fromkeys(memory_of, FULL)
    running, job_id = [], 1000
    held: dict[str, int] = defaultdict(int)
    for _ in range(draw(st.integers(0, 10))):
        gpu = draw(st.sampled_from(sorted(room)))
        fraction = draw(st.booleans())
        if fraction:
            share = draw(st.sampled_from(SHARES))
            if room[gpu] < share_units(share):
                continue
            room[gpu] -= share_units(share)
            ids, kw = (gpu,), {"gpu_share": share}
        else:
            free = [g for g, left in room.items() if left == FULL]
            if not free:
                continue
            ids = tuple(draw(st.permutations(free))[: draw(st.integers(1, min(3, len(free))))])
            for g in ids:
                room[g] = 0
            kw = {}
        team = draw(st.sampled_from(TEAMS))
        units = share_units(kw["gpu_share"]) if kw else FULL * len(ids)
        borrowing = held[team] + units > FULL * quotas[team].max_gpus
        if not borrowing:
            held[team] += units
        running.append(
            RunningJob(
                job_id=job_id,
                team=team,
                borrowing=borrowing,
                user="u",
                gpus=len(ids),
                priority=draw(st.sampled_from(Priority)),
                gpu_ids=ids,
                started_at=NOW - draw(st.sampled_from((10.0, 100_000.0))),
                submitted_at=NOW - 200_000.0,
                declared_steps=draw(st.sampled_from((None, 1000, 100_000))),
                observed_step_s=1.0,
                **kw,
            )
        )
        job_id += 1
    pending = []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(("share", "share", "memory", "whole")))
        kw = {}
        if kind == "share":
            kw = {"gpu_share": draw(st.sampled_from(SHARES))}
        elif kind == "memory":
            kw = {"gpu_memory_mb": draw(st.sampled_from((8_000, 20_000, 30_000)))}
        pending.append(
            PendingJob(
                job_id=i,
                team=draw(st.sampled_from(TEAMS)),
                user="u",
                gpus=1 if kind != "whole" else draw(st.integers(1, 4)),
                priority=draw(st.sampled_from(Priority)),
                submitted_at=NOW - draw(st.integers(0, 100_000)),
                declared_steps=draw(st.sampled_from((None, 100, 10_000))),
                observed_step_s=1.0,
                **kw,
            )
        )
    return Snapshot(NOW, tuple(host_views), tuple(pending), tuple(running), quotas)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_snapshots(), st.sampled_from(("console", "fifo", "fifo-backfill", "fair-share")))
def test_a_gpu_is_never_over_allocated(snap: Snapshot, policy: str):
    decisions = schedule(snap, PolicyConfig(policy=policy))
    stopped = {p.job_id for p in decisions.preemptions}
    jobs = {j.job_id: j for j in snap.pending}
    memory_of = {g.gpu_id: g.memory_mb for h in snap.hosts for g in h.gpus}
    units: dict[int, int] = defaultdict(int)
    memory: dict[int, int] = defaultdict(int)
    fractional_gpus: set[int] = set()
    whole_gpus: list[int] = []
    guaranteed: dict[str, int] = defaultdict(int)
    for job in snap.running:
        if job.job_id in stopped:
            continue
        guaranteed[job.team] += 0 if job.borrowing else held_units(job)
        for g in job.gpu_ids:
            units[g] += held_units(job) if is_fractional(job) else FULL
            if is_fractional(job):
                fractional_gpus.add(g)
    for p in decisions.placements:
        job = jobs[p.job_id]
        assert len(p.gpu_ids) == job.gpus
        if is_fractional(job):
            assert 0 < p.gpu_share <= 1 and len(p.gpu_ids) == 1
            (g,) = p.gpu_ids
            units[g] += share_units(p.gpu_share)
            memory[g] += job.gpu_memory_mb or 0
            fractional_gpus.add(g)
            if job.gpu_memory_mb and memory_of[g]:
                assert p.gpu_share * memory_of[g] >= job.gpu_memory_mb - 1e-6
            guaranteed[job.team] += 0 if p.borrowing else share_units(p.gpu_share)
        else:
            assert p.gpu_share == 1.0
            whole_gpus.extend(p.gpu_ids)
            for g in p.gpu_ids:
                units[g] += FULL
            guaranteed[job.team] += 0 if p.borrowing else FULL * job.gpus
    assert all(u <= FULL for u in units.values()), units
    assert all(memory[g] <= memory_of[g] for g in memory if memory_of[g]), memory
    # whole-GPU and gang jobs never go on a GPU that a fraction uses
    assert not fractional_gpus.intersection(whole_gpus)
    for team, held in guaranteed.items():
        assert held <= FULL * snap.quotas[team].max_gpus
    placed = {p.job_id for p in decisions.placements}
    assert placed | set(decisions.pending) == set(jobs) and placed.isdisjoint(decisions.pending)
