"""Room for a gang that the free GPUs would hold but not their layout: moving a few running jobs (defragmentation).

With consolidation a gang takes whole hosts (a 16-GPU job on hosts of 4 takes four), and small jobs ending at random
leave the free GPUs scattered. On the Pollux realistic workloads (16 hosts of 4 GPUs) a 16-GPU job first in the
queue waited an hour and a half beside 16 to 21 free GPUs, never four whole hosts of them (the 8- and 16-GPU jobs of
three workloads spent 7-100 % of their wait so: benchmarks/traces/pollux/README.md, "Defragmentation"). Run:ai's
consolidation and Gandiva's migration answer it the same way: move the few jobs in the way onto free GPUs elsewhere.

A plan moves running jobs off the hosts the gang needs, and only where GPUs that are free now and that the gang does
not take would hold each of them (`Move.to`). Each moved job is checkpointed and stopped as a victim is, waits again at
its place in the order, and a later pass starts it where GPUs are free then: in the console its checkpoint takes
seconds, and the simulator does the same (placing the moved jobs on at once, in the same pass, gave the same
figures: Pollux realistic p99 18.05 h against 18.15 h this way, with exact declarations). A job may be moved
when it holds whole GPUs on one host, may be preempted, has run its protected time (preemption.protected_run_s: a
job just moved is not moved again at once), is not a replica of an inference service, and comes before the gang in
the pass's order (a higher class, or a lower score in its class): waiting again, it comes before every job that the
gang's placement let pass, so it starts again first, on the free GPUs the plan found for it. (A job that comes after
the gang, a long-running one under attained service, would wait again behind the queue.) A plan moves at most
`max_moves` jobs; of the plans found, the one that moves the fewest GPUs wins.

Pure: no Django (the console's pass and the simulator call it through scheduler.ConsolePass).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from apps.scheduling.placement import FreeGpus, choose_gpus
from apps.scheduling.preemption import RunState
from apps.scheduling.sharing import is_fractional
from apps.scheduling.types import PendingJob

# Plans checked on a copy of the free GPUs per GPU type, the cheapest first (a copy costs O(GPUs)).
MAX_CHECKED = 4
# The reason a moved job is given (the console shows it on the job's page and in its events).
MOVED = "moved to other GPUs to make room for job {job}, a gang of {gpus} GPUs that the free GPUs fit only if moved"


@dataclass(frozen=True, slots=True)
class Move:
    state: RunState
    # free GPUs off the gang's that would hold it now (where it is likely to start again)
    to: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DefragPlan:
    # the GPUs the gang gets: free ones, and those the moved jobs leave
    gang: tuple[int, ...]
    moves: tuple[Move, ...]

    def moved_gpus(self) -> int:
        return sum(len(move.to) for move in self.moves)


def movable(state: RunState, job: PendingJob, job_score: float) -> bool:
    """Whether the pass may move running job `state` to make room for waiting gang `job` (of score `job_score`)."""
    running = state.job
    return (
        not state.stopped
        and not state.protected
        and running.preemptible
        and running.service_group is None
        and not is_fractional(running)
        and len(state.hosts) == 1
        and (-int(running.priority), state.score) < (-int(job.priority), job_score)
    )


def plan_defrag(
    job: PendingJob, job_score: float, states: Sequence[RunState], free: FreeGpus, consolidate: bool, max_moves: int
) -> DefragPlan | None:
    """The plan that moves the fewest GPUs so that whole-GPU gang `job` fits, or None (it fits already, no plan
    moves at most `max_moves` jobs, or the moved jobs would find no free GPUs). Only for consolidated placement:
    without it a gang fits wherever enough GPUs are free."""
    if not consolidate or job.gpus <= 1 or is_fractional(job) or max_moves <= 0:
        return None
    by_host: dict[str, list[RunState]] = {}
    for state in states:
        if movable(state, job, job_score):
            by_host.setdefault(next(iter(state.hosts)), []).append(state)
    if not by_host:
        return None
    best: DefragPlan | None = None
    for gpu_type in [job.gpu_type] if job.gpu_type else free.types():
        plan = _plan_for_type(job, gpu_type, by_host, free, max_moves)
        if plan is not None and (best is None or plan.moved_gpus() < best.moved_gpus()):
            best = plan
    return best


def _plan_for_type(
    job: PendingJob, gpu_type: str, by_host: dict[str, list[RunState]], free: FreeGpus, max_moves: int
) -> DefragPlan | None:
    if free.count(gpu_type) < job.gpus:
        return None
    allowed = free.hosts_for(job)
    capacity = free.host_capacity.get(gpu_type, 0)
    if capacity <= 0:
        return None
    width = -(-job.gpus // capacity)  # hosts the gang spans (the fewest that hold it)
    free_on = free.free.get(gpu_type, {})
    # host -> (GPUs it would have free with its movable jobs moved, those jobs largest first)
    room: dict[str, tuple[int, list[RunState]]] = {}
    for host in free.host_gpus.get(gpu_type, {}):
        if allowed is not None and host not in allowed:
            continue
        movers = sorted(
            (s for s in by_host.get(host, ()) if s.hosts[host][0] == gpu_type),
            key=lambda s: (-s.hosts[host][1], s.job.job_id),
        )
        room[host] = (len(free_on.get(host, ())) + sum(s.hosts[host][1] for s in movers), movers)
    # The hosts to empty: the `width` whose movable jobs leave the most room, fewest GPUs to move first.
    ranked = sorted(
        (host for host in room if room[host][0] > 0),
        key=lambda h: (-min(room[h][0], capacity), room[h][0] - len(free_on.get(h, ())), free.host_order[h]),
    )
    candidates = [ranked[:width]] if width > 1 else [[host] for host in ranked]
    # The cheapest first (the GPUs they would move), each then checked on a copy of the free GPUs.
    planned = []
    for hosts in candidates:
        need = job.gpus - sum(len(free_on.get(h, ())) for h in hosts)
        chosen = _movers(need, [s for h in hosts for s in room[h][1]])
        if chosen is not None and len(chosen) <= max_moves:
            planned.append((sum(s.job.gpus for s in chosen), hosts, chosen))
    planned.sort(key=lambda item: item[0])
    for _, hosts, movers in planned[:MAX_CHECKED]:
        plan = _checked(job, gpu_type, hosts, movers, free)
        if plan is not None:
            return plan
    return None


def _movers(need: int, movable_here: list[RunState]) -> list[RunState] | None:
    """Movable jobs that free at least `need` GPUs: the largest first, then without those the others make room
    without (the smallest first); None if all of them do not, [] if none is needed (it fits already)."""
    movers: list[RunState] = []
    for state in sorted(movable_here, key=lambda s: (-s.job.gpus, s.job.job_id)):
        if need <= 0:
            break
        movers.append(state)
        need -= state.job.gpus
    if need > 0:
        return None
    for state in sorted(movers, key=lambda s: (s.job.gpus, -s.job.job_id)):
        if need + state.job.gpus <= 0:
            movers.remove(state)
            need += state.job.gpus
    return movers


def _checked(
    job: PendingJob, gpu_type: str, hosts: list[str], movers: list[RunState], free: FreeGpus
) -> DefragPlan | None:
    """The gang on `hosts` once `movers` leave them, each mover on free GPUs off the gang's; None if the gang or a
    mover then finds no GPUs."""
    if not movers:
        return None
    scratch = free.copy()
    scratch.give(g for state in movers for g in state.job.gpu_ids)
    gang = choose_gpus(scratch, job.gpus, gpu_type, True, _only(hosts, free.hosts_for(job)))
    if gang is None:
        return None
    scratch.take(gang)
    taken = set(gang)
    moving = [state for state in movers if taken.intersection(state.job.gpu_ids)]
    for state in movers:
        if state not in moving:  # (the gang did not need its GPUs after all: it stays where it is)
            scratch.take(g for g in state.job.gpu_ids if scratch.is_free(g))
    moves = []
    for state in moving:
        to = choose_gpus(scratch, state.job.gpus, gpu_type, True, scratch.hosts_for(state.job))
        if to is None:
            return None
        scratch.take(to)
        moves.append(Move(state, to))
    return DefragPlan(gang, tuple(moves)) if moves else None


def _only(hosts: list[str], allowed: Collection[str] | None) -> frozenset[str]:
    return frozenset(h for h in hosts if allowed is None or h in allowed)
