"""Choosing which running jobs to stop so that a waiting gang fits.

Who may be stopped for whom (Kueue-like): a job borrowing beyond its team's quota, by any job of another team that
is within its own quota (reclaim: no protection; borrowing was the deal); a job of the same team in
a lower priority class; a job of the same team and class whose predicted remaining GPU-time is `ratio` times
longer (shorter_ratio: barely longer for a much wider gang where both declare their steps). The last two only once
the victim has run its protected time (protected_run_s: the minimum run time, rising with the preemptions it has
taken, never a permanent cap).
Victims are taken cheapest first: reclaimable borrowers, then lower classes, then the longest remaining.

A service's replica is never stopped for a job of the same priority unless another replica of that service stays
running: an inference service must keep answering (a higher class may still take it, and a lending team may
still reclaim a replica that borrowed).

Fractional jobs are ordinary victims, but stopping some of the fractions on a GPU frees no whole GPU: the fractions
sharing a GPU are taken together, as one victim that frees that GPU, and only when every one of them may be
stopped. A waiting fraction asks for one whole GPU this way (a GPU with room would have been used already).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from apps.scheduling.config import PolicyConfig
from apps.scheduling.placement import FreeGpus, choose_gpus
from apps.scheduling.prediction import RuntimeHistory
from apps.scheduling.sharing import FULL, held_units, is_fractional, min_units
from apps.scheduling.types import PendingJob, RunningJob, Snapshot

RECLAIM = "reclaim"
PRIORITY = "priority"
SHORTER = "shorter"
# (a SHORTER that only a wide gang's lower bar allows: shorter_ratio)
GANG = "gang"


def with_learned_protection(config: PolicyConfig, history: RuntimeHistory | None) -> PolicyConfig:
    """The config a pass runs with: its minimum run before preemption no longer than `min_run_median_fraction` of
    the median run time of the cluster's finished jobs (RuntimeHistory.median_run_s), once it has enough of them,
    nor shorter than `min_run_floor_s` (unless the configured minimum itself is)."""
    median = history.median_run_s() if history is not None and config.min_run_median_fraction > 0 else None
    if median is None:
        return config
    learned = max(config.min_run_median_fraction * median, config.min_run_floor_s)
    if learned >= config.min_run_before_preempt_s:
        return config
    return replace(config, min_run_before_preempt_s=learned)


def protected_run_s(preemptions: int, config: PolicyConfig) -> float:
    """How long a job preempted `preemptions` times runs, each time it starts, before a priority or
    shortest-first preemption may stop it again (config: a bar that rises with its preemptions, up to a ceiling)."""
    base = config.min_run_before_preempt_s
    extra = preemptions - config.max_preemptions_per_job + 1
    if extra <= 0 or config.preempt_protection_growth <= 1.0:
        return base
    return max(base, min(config.max_protection_s, base * config.preempt_protection_growth**extra))


@dataclass(slots=True)
class RunState:
    job: RunningJob
    remaining_s: float
    score: float
    # Inside its protected run time (protected_run_s): only a reclaim may stop it.
    protected: bool
    # host -> (gpu type, schedulable GPUs of this job on that host)
    hosts: dict[str, tuple[str, int]]
    # Units of each of its GPUs that it holds (sharing.FULL for whole GPUs).
    units: int = FULL
    stopped: bool = False

    @property
    def held(self) -> int:
        """Units held in all (quota accounting)."""
        return self.units * len(self.job.gpu_ids) if is_fractional(self.job) else FULL * self.job.gpus

    def victim_order(self) -> tuple[int, int, float, int]:
        return (0 if self.job.borrowing else 1, int(self.job.priority), -self.score, self.job.job_id)


def victim_kind(
    victim: RunState, job: PendingJob, job_score: float, within_quota: bool, config: PolicyConfig
) -> str | None:
    running = victim.job
    if victim.stopped:
        return None
    if running.borrowing and running.team != job.team and within_quota:
        return RECLAIM
    if victim.protected or not running.preemptible or running.team != job.team:
        return None
    ratio = shorter_ratio(job, running, config)
    kind = outranks(int(job.priority), job_score, int(running.priority), victim.score, config, ratio)
    if kind == SHORTER and victim.score <= config.srpt_preempt_ratio * job_score:
        return GANG
    return kind


def shorter_ratio(job: PendingJob, running: RunningJob, config: PolicyConfig) -> float:
    """How many times the waiting job's score the running job's must be for the first to stop it as shorter:
    `srpt_preempt_ratio`, or `gang_preempt_ratio` for a gang at least `gang_preempt_width` times as wide as a job it
    would stop, both declaring their steps (both ordered by declared size). Muri trace3, exact declarations, with the
    aging of declared jobs x6 and DECLARED_SIZE_FRACTION 0.4: 50.5 h at 1.5 for all, 48.6 h so (the SRSF oracle
    51.1 h; at loads 0.9 / 1.1: 37.0 / 60.6 h), as for gangs 2x as wide; 1.2 instead of 1.01: 50.4 h. Where a gang
    is not wider, stopping a job for one barely shorter would trade a nearly equal job for the restart of the
    other; the Pollux workloads (few wide jobs) move by 1 % either way (benchmarks/traces/muri/README.md)."""
    return stop_ratio(job.gpus, job.declared_steps is not None, running.gpus, running.declared_steps is not None,
                      config)


def stop_ratio(job_gpus: int, job_declares: bool, victim_gpus: int, victim_declares: bool,
               config: PolicyConfig) -> float:
    """shorter_ratio by what it looks at (the start estimates' replay has no PendingJob or RunningJob)."""
    width = gang_bar_width(victim_gpus, config)
    if width is not None and job_declares and victim_declares and job_gpus >= width:
        return min(config.gang_preempt_ratio, config.srpt_preempt_ratio)
    return config.srpt_preempt_ratio


def gang_bar_width(victim_gpus: int, config: PolicyConfig) -> float | None:
    """The fewest GPUs a waiting job that declares its steps must ask for to stop a running one of `victim_gpus`
    that declares its own at the gangs' lower bar (shorter_ratio); None: no such bar."""
    if config.gang_preempt_width <= 0:
        return None
    return config.gang_preempt_width * max(1, victim_gpus)


def least_shorter_ratio(job: PendingJob, config: PolicyConfig) -> float:
    """The least shorter_ratio `job` can have against any running job: the gangs' bar only for a job that declares
    its steps and is at least `gang_preempt_width` GPUs wide (the victim index's bound: a narrower job's victim
    searches stay skipped as before)."""
    return stop_ratio(job.gpus, job.declared_steps is not None, 1, True, config)


def outranks(job_priority: int, job_score: float, victim_priority: int, victim_score: float,
             config: PolicyConfig, ratio: float | None = None) -> str | None:
    """Why a waiting job may stop a running job of its own team by their classes and scores (PRIORITY or SHORTER),
    protection aside; None if it may not. `ratio`: shorter_ratio of the two jobs (default `srpt_preempt_ratio`)."""
    if config.priority_preemption and victim_priority < job_priority:
        return PRIORITY
    if ratio is None:
        ratio = config.srpt_preempt_ratio
    if config.srpt_preemption and victim_priority == job_priority and victim_score > ratio * job_score:
        return SHORTER
    return None


@dataclass
class VictimIndex:
    """GPU counts of possible victims, to skip hopeless victim searches in O(log n) instead of scanning."""

    borrowed_by_team: dict[str, int] = field(default_factory=dict)
    borrowed_total: int = 0
    # (team, priority) -> GPUs of stoppable jobs
    by_class: dict[tuple[str, int], int] = field(default_factory=dict)
    # (team, priority) -> ascending scores and, for each, the GPUs of jobs scoring at least that much
    scores: dict[tuple[str, int], tuple[list[float], list[int]]] = field(default_factory=dict)

    @classmethod
    def build(cls, states: list[RunState]) -> VictimIndex:
        index = cls()
        by_score: dict[tuple[str, int], list[tuple[float, int]]] = {}
        for state in states:
            job = state.job
            if state.stopped:
                continue
            if job.borrowing:
                index.borrowed_by_team[job.team] = index.borrowed_by_team.get(job.team, 0) + job.gpus
                index.borrowed_total += job.gpus
            if state.protected or not job.preemptible:
                continue
            key = (job.team, int(job.priority))
            index.by_class[key] = index.by_class.get(key, 0) + job.gpus
            by_score.setdefault(key, []).append((state.score, job.gpus))
        for key, entries in by_score.items():
            entries.sort()
            suffix = [0] * len(entries)
            total = 0
            for i in range(len(entries) - 1, -1, -1):
                total += entries[i][1]
                suffix[i] = total
            index.scores[key] = ([score for score, _ in entries], suffix)
        return index

    def remove(self, state: RunState) -> None:
        """Forget a stopped victim (its score entry stays: the bound only needs to stay an upper bound)."""
        job = state.job
        if job.borrowing:
            self.borrowed_by_team[job.team] -= job.gpus
            self.borrowed_total -= job.gpus
        key = (job.team, int(job.priority))
        if key in self.by_class and not state.protected and job.preemptible:
            self.by_class[key] -= job.gpus

    def stoppable_gpus(
        self, job: PendingJob, job_score: float, within_quota: bool, config: PolicyConfig
    ) -> int:
        """An upper bound on the GPUs that victims of `job` hold."""
        total = self.borrowed_total - self.borrowed_by_team.get(job.team, 0) if within_quota else 0
        priority = int(job.priority)
        if config.priority_preemption:
            total += sum(self.by_class.get((job.team, p), 0) for p in range(priority))
        if config.srpt_preemption:
            scores, suffix = self.scores.get((job.team, priority), ([], []))
            first = bisect_right(scores, least_shorter_ratio(job, config) * job_score)
            total += suffix[first] if first < len(suffix) else 0
        return total


@dataclass(slots=True)
class VictimPlan:
    victims: list[tuple[RunState, str]]
    gpu_type: str

    def cost(self) -> tuple[int, int, int]:
        return _cost(self.victims)


def _cost(victims: Iterable[tuple[RunState, str]]) -> tuple[int, int, int]:
    """(the highest class stopped (-1: none), units stopped, victims): the less the better (NO_COST the least)."""
    worst = -1
    held = count = 0
    for victim, _ in victims:
        priority = int(victim.job.priority)
        if priority > worst:
            worst = priority
        held += victim.held
        count += 1
    return (worst, held, count)


# The cost of stopping no one.
NO_COST = (-1, 0, 0)

# Victims that free GPUs together: one whole-GPU job, or all the fractions sharing one GPU.
Group = list[tuple[RunState, str]]


def _groups_on_hosts(
    gpu_type: str, eligible: list[tuple[RunState, str]], sharers: dict[int, list[RunState]]
) -> dict[str, list[tuple[Group, int]]]:
    """host -> (victim group, GPUs it frees there), in victim order (a group of fractions comes when its last
    member does)."""
    on_host: dict[str, list[tuple[Group, int]]] = {}
    kinds: dict[int, str] = {}
    rank: dict[int, int] = {}
    for state, kind in eligible:
        if not is_fractional(state.job):
            for host, (host_type, count) in state.hosts.items():
                if host_type == gpu_type:
                    on_host.setdefault(host, []).append(([(state, kind)], count))
            continue
        if not kinds:  # (made for the first fraction: a plan for whole-GPU victims alone needs neither)
            kinds = {id(state): kind for state, kind in eligible}
            rank = {id(state): i for i, (state, _) in enumerate(eligible)}
        for host, (host_type, _) in state.hosts.items():
            if host_type != gpu_type:
                continue
            for gpu_id in state.job.gpu_ids:
                members = [s for s in sharers.get(gpu_id, ()) if not s.stopped]
                if all(id(s) in kinds for s in members) and max(members, key=lambda s: rank[id(s)]) is state:
                    on_host.setdefault(host, []).append(([(s, kinds[id(s)]) for s in members], 1))
    return on_host


def _plan_for_type(
    job: PendingJob,
    gpu_type: str,
    eligible: list[tuple[RunState, str]],
    free: FreeGpus,
    quota_room_needed: int,
    consolidate: bool,
    sharers: dict[int, list[RunState]],
) -> VictimPlan | None:
    allowed = free.hosts_for(job)
    free_on = {host: len(ids) for host, ids in free.free.get(gpu_type, {}).items()
               if allowed is None or host in allowed}
    on_host = _groups_on_hosts(gpu_type, eligible, sharers)
    if allowed is not None:  # a job with an image: only victims on hosts that run containers make room
        on_host = {host: groups for host, groups in on_host.items() if host in allowed}
    freeable = {
        h: free_on.get(h, 0) + sum(c for _, c in on_host.get(h, ())) for h in free_on.keys() | on_host
    }
    if sum(freeable.values()) < job.gpus:
        return None

    chosen: dict[int, tuple[RunState, str]] = {}

    def stop_until(host: str, needed: int) -> None:
        have = free_on.get(host, 0)
        if chosen:  # (victims chosen on other hosts may free GPUs here too)
            have += sum(c for group, c in on_host.get(host, ()) if all(s.job.job_id in chosen for s, _ in group))
        for group, count in on_host.get(host, ()):
            if have >= needed:
                return
            if not all(s.job.job_id in chosen for s, _ in group):
                for state, kind in group:
                    chosen[state.job.job_id] = (state, kind)
                have += count

    capacity = free.host_capacity.get(gpu_type, 0)
    if allowed is not None:
        capacity = max((n for h, n in free.host_gpus.get(gpu_type, {}).items() if h in allowed), default=0)
    if job.gpus <= capacity:
        best: tuple[tuple[int, int, int], str, dict[int, tuple[RunState, str]]] | None = None
        for host in sorted(freeable, key=free.host_order.__getitem__):
            if freeable[host] < job.gpus:
                continue
            chosen = {}  # (a new dict for each host: the best one is kept as it is)
            stop_until(host, job.gpus)
            cost = _cost(chosen.values())
            if best is None or cost < best[0]:
                best = (cost, host, chosen)
                if cost == NO_COST:  # (no host can do with less than none)
                    break
        if best is None and consolidate:
            return None
        if best is not None:
            chosen = best[2]
    if not chosen and (job.gpus > capacity or not consolidate):
        limit = free.max_hosts(job.gpus, gpu_type, consolidate)
        if allowed is not None and consolidate:
            limit = -(-job.gpus // capacity) if capacity > 0 else 0
        hosts = sorted(freeable, key=lambda h: (-freeable[h], free.host_order[h]))
        if limit is not None:
            hosts = hosts[:limit]
        if sum(freeable[h] for h in hosts) < job.gpus:
            return None
        still = job.gpus
        for host in hosts:
            take = min(still, freeable[host])
            stop_until(host, take)
            still -= take
            if still <= 0:
                break

    # Same-team victims also make room inside the team's quota.
    freed_in_team = sum(s.held for s, _ in chosen.values() if s.job.team == job.team)
    if freed_in_team < quota_room_needed:
        for state, kind in eligible:
            if freed_in_team >= quota_room_needed:
                break
            if state.job.team == job.team and state.job.job_id not in chosen:
                chosen[state.job.job_id] = (state, kind)
                freed_in_team += state.held
        if freed_in_team < quota_room_needed:
            return None
    return VictimPlan(list(chosen.values()), gpu_type)


def _spare_replicas(states: list[RunState]) -> dict[str, int]:
    """Service group -> how many of its running replicas may stop with one still serving (groups with none
    running are absent)."""
    running: dict[str, int] = {}
    for state in states:
        group = state.job.service_group
        if group is not None and state.job.started and not state.stopped:
            running[group] = running.get(group, 0) + 1
    return {group: count - 1 for group, count in running.items()}


def victim_candidates(states: list[RunState], team: str) -> list[RunState]:
    """The states that victim_kind may accept for a job of `team` (its team's, and those borrowing: reclaimable),
    in the order of `states`."""
    return [state for state in states if state.job.team == team or state.job.borrowing]


def plan_preemption(
    job: PendingJob,
    job_score: float,
    within_quota: bool,
    quota_room_needed: int,
    states: list[RunState],
    free: FreeGpus,
    config: PolicyConfig,
    sharers: dict[int, list[RunState]] | None = None,
    candidates: list[RunState] | None = None,
) -> VictimPlan | None:
    """The cheapest set of victims after which `job` fits, or None. `states` must be in victim order;
    `sharers`: gpu id -> the running fractions on it. `quota_room_needed` is in units (sharing.FULL a GPU).
    `candidates`: the states that victim_kind may accept for `job` (victim_candidates), to spare scanning the others;
    None: all of `states`."""
    eligible: list[tuple[RunState, str]] = []
    spare: dict[str, int] | None = None  # (made when a replica first needs it)
    for state in states if candidates is None else candidates:
        kind = victim_kind(state, job, job_score, within_quota, config)
        group = state.job.service_group
        if kind in (SHORTER, GANG) and group is not None:
            if spare is None:
                spare = _spare_replicas(states)
            if spare.get(group, 0) <= 0 if state.job.started else group not in spare:
                continue
            if state.job.started:
                spare[group] -= 1
        if kind is not None:
            eligible.append((state, kind))
    if not eligible:
        return None
    best: VictimPlan | None = None
    for gpu_type in [job.gpu_type] if job.gpu_type else free.types():
        plan = _plan_for_type(
            job, gpu_type, eligible, free, quota_room_needed, config.consolidate, sharers or {}
        )
        if plan is not None and plan.victims and (best is None or plan.cost() < best.cost()):
            best = plan
    return best


def still_needed(snapshot: Snapshot, job_id: int, promised: Iterable[int], config: PolicyConfig) -> bool:
    """Whether the preemptions decided for waiting job `job_id` are still needed, on a snapshot taken just before
    they are sent: False when the job no longer waits, or could now start on GPUs that no job holds and no
    placement of the same pass was given (`promised`), within its team's quota or by borrowing."""
    job = next((j for j in snapshot.pending if j.job_id == job_id), None)
    if job is None:
        return False
    quota = snapshot.quotas.get(job.team)
    if quota is None:
        return True
    held = sum(held_units(r) for r in snapshot.running if r.team == job.team)
    need = min_units(job)
    may_borrow = config.borrowing and quota.may_borrow and job.preemptible
    if held + need > FULL * quota.max_gpus and not may_borrow:
        return True  # the quota, not the GPUs, needs the victims to stop
    free = FreeGpus.from_snapshot(snapshot)
    free.take(g for g in set(promised) if free.is_free(g))
    if job.gpus == 1 and is_fractional(job):
        return free.choose_share(job, min_units(job)) is None
    return choose_gpus(free, job.gpus, job.gpu_type, config.consolidate, free.hosts_for(job)) is None
