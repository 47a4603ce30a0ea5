"""Reference policies for the simulator only: oracles that know true durations, and Tiresias' 2D-LAS.

They model the published simulators: every event, all jobs (running and waiting) are taken in policy order and
admitted greedily on an empty cluster, skipping those that do not fit; running jobs that are not admitted are
preempted, and a job may move to other GPUs (migration, free in those simulators). Placement is the core's
`choose_gpus`. The console never runs these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from apps.scheduling.placement import FreeGpus, choose_gpus
from apps.scheduling.types import (
    Decisions,
    PendingInfo,
    PendingJob,
    Placement,
    Preemption,
    RunningJob,
    Snapshot,
)
from apps.scheduling.usage import attained_gpu_seconds, job_gpus_held

# job id -> (true remaining seconds, true total seconds) at the snapshot's time
Oracle = Callable[[int], tuple[float, float]]
AnyJob = PendingJob | RunningJob

TIRESIAS_THRESHOLDS_GPU_S = (3250.0, 7200.0, 18000.0)


def admit_preemptive(snapshot: Snapshot, ordered: Sequence[AnyJob], consolidate: bool, why: str) -> Decisions:
    """Admit jobs in order on an empty cluster; keep admitted running jobs where they are when possible."""
    scratch = FreeGpus.from_snapshot(replace(snapshot, running=()))
    assignment: dict[int, tuple[int, ...]] = {}
    for job in ordered:
        chosen = choose_gpus(scratch, job.gpus, job.gpu_type, consolidate, scratch.hosts_for(job))
        if chosen is not None:
            scratch.take(chosen)
            assignment[job.job_id] = chosen

    free = FreeGpus.from_snapshot(snapshot)
    preemptions: list[Preemption] = []
    for running in snapshot.running:
        if running.job_id not in assignment:
            free.give(running.gpu_ids)
            preemptions.append(Preemption(running.job_id, why))
    placements: list[Placement] = []
    for job in ordered:
        if isinstance(job, PendingJob) and job.job_id in assignment:
            chosen = choose_gpus(free, job.gpus, job.gpu_type, consolidate, free.hosts_for(job))
            if chosen is None:
                break
            free.take(chosen)
            placements.append(Placement(job.job_id, chosen))
    else:
        return Decisions(tuple(placements), tuple(preemptions), _pending(ordered, assignment))

    # Fragmentation: realize the admission plan itself, migrating running jobs whose GPUs differ.
    placements = []
    for job in ordered:
        target = assignment.get(job.job_id)
        if target is None:
            continue
        if isinstance(job, RunningJob):
            if tuple(sorted(job.gpu_ids)) == tuple(sorted(target)):
                continue
            preemptions.append(Preemption(job.job_id, "migrated to defragment"))
        placements.append(Placement(job.job_id, target))
    return Decisions(tuple(placements), tuple(preemptions), _pending(ordered, assignment))


def admit_waiting(snapshot: Snapshot, ordered: Sequence[PendingJob], consolidate: bool) -> Decisions:
    """Non-preemptive: waiting jobs in order take free GPUs, skipping those that do not fit."""
    free = FreeGpus.from_snapshot(snapshot)
    placements: list[Placement] = []
    assignment: dict[int, tuple[int, ...]] = {}
    for job in ordered:
        chosen = choose_gpus(free, job.gpus, job.gpu_type, consolidate, free.hosts_for(job))
        if chosen is not None:
            free.take(chosen)
            placements.append(Placement(job.job_id, chosen))
            assignment[job.job_id] = chosen
    return Decisions(tuple(placements), (), _pending(ordered, assignment))


def _pending(ordered: Sequence[AnyJob], admitted: dict[int, tuple[int, ...]]) -> dict[int, PendingInfo]:
    waiting = [j for j in ordered if j.job_id not in admitted and isinstance(j, PendingJob | RunningJob)]
    return {
        job.job_id: PendingInfo("waiting in policy order", position, code="waiting")
        for position, job in enumerate(waiting, start=1)
    }


@dataclass
class OracleShortest:
    """SRTF (remaining time) or SRSF (remaining time x GPUs), preemptive, knowing true remaining times."""

    oracle: Oracle
    by_service: bool
    consolidate: bool = True

    def decide(self, snapshot: Snapshot) -> Decisions:
        def key(job: AnyJob) -> tuple[float, float, int]:
            remaining, _ = self.oracle(job.job_id)
            return (remaining * (job.gpus if self.by_service else 1), job.submitted_at, job.job_id)

        jobs: list[AnyJob] = [*snapshot.running, *snapshot.pending]
        ordered = sorted(jobs, key=key)
        why = "preempted for a job with less remaining " + ("service" if self.by_service else "time")
        return admit_preemptive(snapshot, ordered, self.consolidate, why)


@dataclass
class OracleShortestJobFirst:
    """Non-preemptive SJF: waiting jobs by true total duration."""

    oracle: Oracle
    consolidate: bool = True

    def decide(self, snapshot: Snapshot) -> Decisions:
        ordered = sorted(snapshot.pending, key=lambda j: (self.oracle(j.job_id)[1], j.submitted_at, j.job_id))
        return admit_waiting(snapshot, ordered, self.consolidate)


@dataclass
class Tiresias2DLAS:
    """Discretized 2D-LAS: queues by attained GPU-time; FIFO inside a queue, where jobs that could not run go
    to the back (as in the published simulator). Placement counts GPUs only, like that simulator."""

    thresholds: tuple[float, ...] = TIRESIAS_THRESHOLDS_GPU_S
    consolidate: bool = False
    _queue: dict[int, int] = field(default_factory=dict)
    _seq: dict[int, int] = field(default_factory=dict)
    _counter: int = 0

    def _queue_of(self, attained: float) -> int:
        return sum(1 for limit in self.thresholds if attained >= limit)

    def _append(self, job_id: int) -> None:
        self._counter += 1
        self._seq[job_id] = self._counter

    def decide(self, snapshot: Snapshot) -> Decisions:
        now = snapshot.now
        jobs: list[AnyJob] = [*snapshot.running, *snapshot.pending]
        live = {job.job_id for job in jobs}
        for stale in [job_id for job_id in self._seq if job_id not in live]:
            del self._seq[stale], self._queue[stale]
        for job in sorted(jobs, key=lambda j: (j.submitted_at, j.job_id)):
            queue = self._queue_of(attained_gpu_seconds(job, now))
            if self._queue.get(job.job_id) != queue:
                self._queue[job.job_id] = queue
                self._append(job.job_id)
        ordered = sorted(jobs, key=lambda j: (self._queue[j.job_id], self._seq[j.job_id]))
        decisions = admit_preemptive(
            snapshot, ordered, self.consolidate, "preempted by 2D-LAS (less attained)"
        )
        for job_id in sorted(decisions.pending, key=lambda j: decisions.pending[j].position):
            self._append(job_id)
        return replace(decisions, wake_at=self._next_demotion(snapshot, decisions))

    def _next_demotion(self, snapshot: Snapshot, decisions: Decisions) -> float | None:
        now = snapshot.now
        stopped = {p.job_id for p in decisions.preemptions}
        placed = {p.job_id for p in decisions.placements}
        soonest: float | None = None
        running: list[AnyJob] = [j for j in snapshot.running if j.job_id not in stopped]
        running += [j for j in snapshot.pending if j.job_id in placed]
        for job in running:
            attained = attained_gpu_seconds(job, now)
            later = [limit for limit in self.thresholds if limit > attained]
            if later:
                at = now + (later[0] - attained) / job_gpus_held(job)
                soonest = at if soonest is None else min(soonest, at)
        return soonest
