"""The console's scheduling pass: priority classes, quotas with borrowing, fair share, shortest predicted
remaining GPU-time first with aging, gang placement, preemption, and backfill behind one reservation.

One pass, O(pending log pending + GPUs) plus a bounded number of victim searches:
1. Running jobs get a predicted remaining time and a score; pending jobs are sorted by
   (priority class desc, score, submit time, id).
2. Each pending job, in that order, is placed on free GPUs if its team is within quota (or it may borrow); else,
   within quota, it may stop victims (see preemption.py); else it waits with a reason.
3. The first job within quota that cannot start becomes the head: the GPUs it will get when enough running jobs
   end (at their predicted ends) are reserved from then; a later job may use them only if it will end first.
4. Every waiting job gets a position and an estimated start with its confidence (estimate.py): the queue in this
   order replayed on the running jobs' predicted ends, each team within its quota, and victims stopped as soon as
   the preemption rules (minimum run time, cap) allow.

Fractions of a GPU (sharing.py) are counted in units of 1/100 GPU for quotas. They pack onto shared GPUs by best
fit and open a whole GPU only when none fits. So that scattered fractions never block a whole-GPU job forever, the
first whole-GPU job in queue order that can start, or could if fractions left, fences the GPUs it would get:
fractions (of its priority or lower) are not placed there, so those GPUs drain as their fractions end and are not
taken again by fractions ahead of it in the queue (no preemption).
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field, replace
from operator import itemgetter

from apps.scheduling.config import PolicyConfig
from apps.scheduling.defrag import MOVED, plan_defrag
from apps.scheduling.estimate import Order, Waiting, expected_arrivals, start_times
from apps.scheduling.estimate import Release as EndsAt
from apps.scheduling.host_needs import host_need
from apps.scheduling.ordering import (
    EMPTY_HISTORY,
    SERVICE_QUANTILES,
    FairShare,
    NeverRun,
    ServiceEstimate,
    aging_boost,
    declared_aging_s,
    estimate_service,
    job_aging_s,
    service_estimate,
    with_learned_aging,
)
from apps.scheduling.placement import FreeGpus, choose_gpus
from apps.scheduling.prediction import (
    MAX_SIMILAR_SIGMA,
    MIN_DECISION_REMAINING_S,
    RuntimeHistory,
    ServiceQueue,
    elapsed_run_s,
    predict_remaining,
)
from apps.scheduling.preemption import (
    GANG,
    PRIORITY,
    RECLAIM,
    SHORTER,
    RunState,
    VictimIndex,
    gang_bar_width,
    outranks,
    plan_preemption,
    protected_run_s,
    stop_ratio,
    victim_candidates,
    with_learned_protection,
)
from apps.scheduling.sharing import FULL, fmt_gpus, held_units, is_fractional, min_units
from apps.scheduling.types import (
    Decisions,
    PendingInfo,
    PendingJob,
    Placement,
    Preemption,
    RunningJob,
    Snapshot,
)
from apps.scheduling.usage import attained_gpu_seconds, budget_reason, job_gpus_held

PREEMPTION_REASONS = {
    RECLAIM: "GPUs borrowed beyond team {team}'s quota were reclaimed by job {job} of team {other}",
    PRIORITY: "stopped for higher-priority job {job} ({priority}) of team {other}",
    SHORTER: "stopped for job {job}, predicted to finish much sooner",
    GANG: "stopped for job {job}, a much wider gang whose declared size is smaller (it would otherwise wait for "
          "several running jobs to end at once)",
}
BUDGET_STOP = "team {team}'s monthly GPU-hour budget is spent and the team stops its jobs when it is (checkpoint and stop)"

# Waiting for reasons that no job's end changes: no estimated start (a spent budget comes back only next month).
NO_ESTIMATE = frozenset({"budget", "no_gpu_type", "no_runtime", "too_large", "no_quota"})
# Waiting for its own team's (or user's) jobs to end: jobs of other teams do not hold it back.
OWN_LIMIT = frozenset({"quota", "user_cap"})
# The waiting jobs, first in the queue, whose time-slices the replay foresees (_with_slices), and those whose
# expected hold of their GPUs it looks up (more: hundreds of a burst may be ahead): bound the pass.
SLICED_JOBS = 128
HELD_JOBS = 512
# A running job's score is looked at (for when it becomes a victim) at most this many moments ahead, the first
# this long into its run.
MAX_SCORE_PROBES = 8
SCORE_PROBE_S = 300.0
# Submissions looked at for a sweep going on (estimate.expected_arrivals).
RECENT_S = 24 * 3600.0
# Whole-GPU jobs examined for the fraction fence per pass (the first one that fractions block is fenced for).
FENCE_SCAN = 64

# (gpu ids, units on each): FULL units for whole GPUs, fewer for a fraction of its one GPU.
Choice = tuple[tuple[int, ...], int]
# (predicted end, gpu ids, team, units on each GPU, memory MB on each GPU)
Release = tuple[float, tuple[int, ...], str, int, int]
# a waiting job in pass order: (-priority, score, submitted at, job id, job, predicted remaining seconds (at least
# MIN_DECISION_REMAINING_S), the prediction as it is, its confidence)
Ranked = tuple[int, float, float, int, PendingJob, float, float, float]
_class_of, _score_of = itemgetter(0), itemgetter(1)
# a job left waiting: (job, predicted remaining seconds, code, reason)
Explained = tuple[PendingJob, float, str, str]


@dataclass(slots=True)
class Reservation:
    job_id: int
    start: float
    gpu_ids: frozenset[int]
    # Reserved GPUs that are free now, held out of the pool.
    held: set[int] = field(default_factory=set)


def _type_label(gpu_type: str | None) -> str:
    return f" of type {gpu_type}" if gpu_type else ""


def _fmt_hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _asked(job: PendingJob) -> str:
    if not is_fractional(job):
        return f"{job.gpus} GPUs"
    parts = [f"{job.gpu_share:g} of a GPU"] if job.gpu_share < 1.0 else []
    if job.gpu_memory_mb is not None:
        parts.append(f"{job.gpu_memory_mb} MB of GPU memory")
    return " and ".join(parts)


def _any_fraction(jobs: tuple[PendingJob, ...]) -> bool:
    # (sharing.is_fractional, written out in a loop: cheaper than any() over a generator for ten thousand jobs)
    for job in jobs:  # noqa: SIM110
        if job.gpus == 1 and (job.gpu_share < 1.0 or job.gpu_memory_mb is not None):
            return True
    return False


def _foretold_by_its_program(job: PendingJob | RunningJob, history: RuntimeHistory) -> bool:
    """Whether the job's program's finished runs have foretold its later runs well enough for the order to weigh
    them (ordering._blended's rule): its prediction is then its own, not a guess from the cluster's runs."""
    key = job.similarity_key
    return key is not None and key in history.programs() and history.similar_sigma(key) <= MAX_SIMILAR_SIGMA


def _firsts(queue: list[Waiting], teams: set[str]) -> tuple[dict[str, int], dict[tuple[str, int], float]]:
    """For `teams`: each one's top class among the waiting jobs of `queue`, and its best score in each class it
    has jobs of. `queue` is in pass order (class down, then score up, each class a run of it): a team's first job
    is in its top class, and its first of each class has its best score; a class's run is found by bisection and
    read only until it has shown every team (a few dozen jobs of thousands, nearly always)."""
    top_class: dict[str, int] = {}
    best_score: dict[tuple[str, int], float] = {}
    start = 0
    while start < len(queue) and teams:
        negative_priority = queue[start].order[0]
        end = bisect_right(queue, negative_priority, lo=start, key=_class_of_waiting)
        priority, seen = -negative_priority, 0
        for i in range(start, end):
            w = queue[i]
            if w.team in teams and (w.team, priority) not in best_score:
                best_score[(w.team, priority)] = w.order[1]
                top_class.setdefault(w.team, priority)
                seen += 1
                if seen == len(teams):
                    break
        start = end
    return top_class, best_score


# (team, class) -> the GPUs asked for by its waiting jobs that declare their steps, ascending, and the best score
# among those asking for at least each
_Gangs = dict[tuple[str, int], tuple[list[int], list[float]]]


def _declared_gangs(queue: list[Waiting], config: PolicyConfig) -> _Gangs:
    """The waiting jobs that may stop a running job at the gangs' lower bar (preemption.shorter_ratio): those that
    declare their steps and ask for at least the bar's width, by team and class (_outranked_by_gang)."""
    least = gang_bar_width(1, config)
    if least is None:
        return {}
    scores: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for w in queue:
        if w.declared and w.gpus >= least:
            best = scores[(w.team, -w.order[0])]
            if w.order[1] < best.get(w.gpus, math.inf):
                best[w.gpus] = w.order[1]
    gangs: _Gangs = {}
    for key, by_gpus in scores.items():
        widths = sorted(by_gpus)
        bests = [by_gpus[g] for g in widths]
        for i in range(len(bests) - 2, -1, -1):
            bests[i] = min(bests[i], bests[i + 1])
        gangs[key] = (widths, bests)
    return gangs


def _outranked_by_gang(gangs: _Gangs, running: RunningJob, score: float, config: PolicyConfig) -> bool:
    """Whether a waiting gang of `gangs` may stop `running` (which declares its steps), of that score, as shorter."""
    entry = gangs.get((running.team, int(running.priority)))
    width = gang_bar_width(running.gpus, config)
    if entry is None or width is None:
        return False
    widths, bests = entry
    i = bisect_left(widths, width)
    if i == len(widths):
        return False
    ratio = stop_ratio(widths[i], True, running.gpus, True, config)
    return outranks(int(running.priority), bests[i], int(running.priority), score, config, ratio) is not None


def _class_of_waiting(w: Waiting) -> int:
    return w.order[0]


def _sort_pass_order(ordered: list[Ranked]) -> None:
    """ordered.sort(), the same order for less: when no two scores are equal (nearly always), the order is by class
    then score, and two stable sorts on the plain floats and ints compare far cheaper than ten thousand tuples."""
    scores = {entry[1] for entry in ordered}
    if len(scores) < len(ordered) or any(map(math.isnan, scores)):  # ties, or NaN: tuples
        ordered.sort()  # job ids are unique: the comparison never reaches the job itself
        return
    ordered.sort(key=_score_of)
    ordered.sort(key=_class_of)


@dataclass(slots=True)
class Fence:
    """GPUs that fractions of `priority` or lower may not use: they are kept for whole-GPU job `job_id`."""

    job_id: int
    priority: int
    gpu_ids: frozenset[int]


class ConsolePass:
    # Slots: the pass reads its own fields millions of times, and past 30 fields an instance's dict no longer shares
    # its keys (CPython 3.11), every read of one a lookup.
    __slots__ = (
        "behind_reasons", "borrow_reasons", "candidates", "capacity_reasons", "confidence", "config",
        "need_total", "defrag_moves", "defrag_searches", "expected", "fair", "fence", "free", "moved_remaining",
        "no_fit", "now", "pending", "placed_ends", "placed_jobs", "placements", "preemptions", "quotas", "reservation",
        "schedulable_total",
        "scores", "searches", "service", "sharers", "snapshot", "states", "team_held", "team_lends", "user_held",
        "victim_index", "widest_host",
    )

    def __init__(self, snapshot: Snapshot, config: PolicyConfig) -> None:
        self.snapshot = snapshot
        self.quotas = snapshot.quotas
        self.config = config
        self.now = snapshot.now
        self.free = FreeGpus.from_snapshot(snapshot)
        self.fair = FairShare(snapshot, config.fair_share_weight)
        # GPUs held, in units of 1/100 GPU (sharing.FULL per GPU)
        self.team_held: dict[str, int] = defaultdict(int)
        self.user_held: dict[tuple[str, str], int] = defaultdict(int)
        self.schedulable_total: dict[str, int] = defaultdict(int)
        # ... and, per HostNeed key, those on the hosts that meet it (the ones a job with that need may use)
        self.need_total: dict[str, dict[str, int]] = {key: defaultdict(int) for key in self.free.need_hosts}
        for host, gpu_type, _ in self.free.location.values():
            self.schedulable_total[gpu_type] += 1
            for key, hosts in self.free.need_hosts.items():
                if host in hosts:
                    self.need_total[key][gpu_type] += 1
        self.states: list[RunState] = []
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.pending: dict[int, PendingInfo] = {}
        self.reservation: Reservation | None = None
        self.searches = 0
        self.defrag_searches = 0
        self.defrag_moves = 0  # jobs moved for a gang in this pass
        self.no_fit: dict[str | None, tuple[int, int]] = {}  # (whole-GPU jobs with no host need)
        self.widest_host: dict[str | None, int] = {t: n for t, n in self.free.host_capacity.items()}
        self.widest_host[None] = min(self.free.host_capacity.values(), default=0)
        self.capacity_reasons: dict[tuple[str | None, int, int | None, bool, bool], tuple[str, str] | None] = {}
        self.victim_index = VictimIndex()
        # jobs placed in this pass
        self.placed_ends: list[Release] = []
        # gpu id -> running fractional jobs on it
        self.sharers: dict[int, list[RunState]] = defaultdict(list)
        self.fence: Fence | None = None
        # job id -> confidence of its run-time prediction (prediction.py), and the prediction without the floor
        # that decisions use (estimates take it as it is)
        self.confidence: dict[int, float] = {}
        self.expected: dict[int, float] = {}
        # jobs placed in this pass, with their predicted run time
        self.placed_jobs: list[tuple[PendingJob, float, int]] = []
        # job id -> the order's estimate of its remaining GPU-time (ordering.estimate_service)
        self.service: dict[int, ServiceEstimate] = {}
        # job id -> its score (_score)
        self.scores: dict[int, float] = {}
        # team -> whether it may borrow beyond its quota at all (_waiting_entry)
        self.team_lends: dict[str, bool] = {}
        # team -> the running jobs that its jobs may stop (preemption.victim_candidates), in victim order
        self.candidates: dict[str, list[RunState]] = {}
        # waiting jobs of higher classes -> the reason that says so (_behind)
        self.behind_reasons: dict[int, str] = {}
        # (team, units held, quota) -> the reason of a job waiting to borrow (_borrow_reason)
        self.borrow_reasons: dict[tuple[str, int, int], str] = {}
        # (a job that never ran as like ones are, a later queue) -> its remaining GPU-seconds moved on there (_slice)
        self.moved_remaining: dict[tuple[object, int], float] = {}

    # -- scores -------------------------------------------------------------------------------------------
    def _remaining(self, job: PendingJob | RunningJob) -> float:
        remaining, confidence = predict_remaining(job, self.now, self.snapshot.history, self.config.default_runtime_s)
        self.confidence[job.job_id] = confidence
        self.expected[job.job_id] = remaining
        return max(remaining, MIN_DECISION_REMAINING_S)

    def _score(self, job: PendingJob | RunningJob, remaining_s: float) -> float:
        """The job's place in its class (lower first). It does not depend on `remaining_s` (the order's own
        estimate, ordering.estimate_service, is kept per job id), so it is computed once per job and pass."""
        score = self.scores.get(job.job_id)
        if score is not None:
            return score
        ordering = self.config.ordering
        if ordering == "fifo":
            score = 0.0
        else:
            boost = aging_boost(job.submitted_at, self.now, job_aging_s(job, self.config))
            penalty = self.fair.penalty(job.team, job.user)
            if ordering == "fair-share":
                score = penalty / boost
            else:
                service = estimate_service(job, self.now, self.snapshot.history)
                self.service[job.job_id] = service
                score = self._service_score(job, self.now, service.remaining_gpu_s)
        self.scores[job.job_id] = score
        return score

    def _service_score(self, job: PendingJob | RunningJob, at: float, remaining_gpu_s: float) -> float:
        """A job's score under shortest-remaining at `at`: its remaining GPU-time x its fair-share penalty, over its
        aging boost then."""
        penalty = self.fair.penalty(job.team, job.user)
        return remaining_gpu_s * penalty / aging_boost(job.submitted_at, at, job_aging_s(job, self.config))

    def _ranked(self) -> list[Ranked]:
        """The waiting jobs in pass order, each with its predicted remaining time (as _remaining) and its score
        (as _score): the same figures, with what is the same for every job looked up once (ten thousand jobs).
        They are kept by job id (self.expected, confidence, scores) only for the jobs placed (run)."""
        now, history, default_s = self.now, self.snapshot.history, self.config.default_runtime_s
        ordering, aging_s = self.config.ordering, self.config.aging_s
        declared_aging = declared_aging_s(self.config)  # (job_aging_s written out)
        queues_of = history or EMPTY_HISTORY
        penalties: dict[tuple[str, str], float] = {}
        never_run = NeverRun(queues_of)
        # (the order's estimate of a job that never ran, made with its prediction: NeverRun.figures)
        by_service = ordering not in ("fifo", "fair-share")
        gpu_s = 0.0
        ordered: list[Ranked] = []
        for job in self.snapshot.pending:
            job_id = job.job_id
            if by_service and not job.attained_gpu_seconds:
                expected, confidence, gpu_s = never_run.figures(job, default_s)
            else:
                expected, confidence = predict_remaining(job, now, history, default_s)
            # (max() and aging_boost written out: ten thousand jobs)
            remaining = MIN_DECISION_REMAINING_S if expected < MIN_DECISION_REMAINING_S else expected
            if ordering == "fifo":
                score = 0.0
            else:
                waited = now - job.submitted_at
                job_aging = aging_s if job.declared_steps is None else declared_aging
                boost = 1.0 + (waited if waited > 0.0 else 0.0) / job_aging if job_aging > 0 else 1.0
                penalty = penalties.get((job.team, job.user))
                if penalty is None:
                    penalty = penalties[(job.team, job.user)] = self.fair.penalty(job.team, job.user)
                if ordering == "fair-share":
                    score = penalty / boost
                elif job.attained_gpu_seconds:
                    score = service_estimate(job, now, queues_of)[0] * penalty / boost
                else:
                    score = gpu_s * penalty / boost
            ordered.append((-job.priority, score, job.submitted_at, job_id, job, remaining, expected, confidence))
        _sort_pass_order(ordered)
        return ordered

    def _running_states(self) -> None:
        config = self.config
        for job in self.snapshot.running:
            units = held_units(job)
            self.team_held[job.team] += units
            self.user_held[(job.team, job.user)] += units
            remaining = self._remaining(job)
            hosts: dict[str, tuple[str, int]] = {}
            for gpu_id in job.gpu_ids:
                where = self.free.location.get(gpu_id)
                if where is not None:
                    host, gpu_type, _ = where
                    hosts[host] = (gpu_type, hosts.get(host, (gpu_type, 0))[1] + 1)
            protected = self.now - job.started_at < protected_run_s(job.preemption_count, config)
            per_gpu = units if is_fractional(job) else FULL
            state = RunState(job, remaining, self._score(job, remaining), protected, hosts, per_gpu)
            self.states.append(state)
            if is_fractional(job):
                for gpu_id in job.gpu_ids:
                    self.sharers[gpu_id].append(state)
        self.states.sort(key=RunState.victim_order)
        self.victim_index = VictimIndex.build(self.states)

    # -- placement ----------------------------------------------------------------------------------------
    def _choose(self, job: PendingJob, remaining_s: float) -> Choice | None:
        if job.gpus == 1 and is_fractional(job):  # (the first test keeps the pass over gangs cheap)
            return self._choose_share(job)
        chosen = self._choose_whole(job, remaining_s)
        return None if chosen is None else (chosen, FULL)

    def _fenced(self, job: PendingJob) -> set[int] | frozenset[int]:
        fence: set[int] | frozenset[int] = frozenset()
        if self.fence is not None and int(job.priority) <= self.fence.priority:
            fence = self.fence.gpu_ids
        if self.reservation is not None:
            fence = fence | self.reservation.gpu_ids
        return fence

    def _choose_share(self, job: PendingJob) -> Choice | None:
        found = self.free.choose_share(job, min_units(job), self._fenced(job))
        return None if found is None else ((found[0],), found[1])

    def _known_no_fit(self, job: PendingJob) -> bool:
        """Whether _choose is sure to find nothing for `job`, as _choose_whole would know it (a gang at least as
        wide as one that found no GPUs since GPUs last came back, and no reserved GPUs it might use): most jobs of a
        long queue, told without the calls."""
        if host_need(job) is not None or (self.reservation is not None and self.reservation.held):
            return False
        failed = self.no_fit.get(job.gpu_type)
        if failed is None or failed[0] != self.free.version or job.gpus < failed[1]:
            return False
        if job.gpus == 1 and (job.gpu_share < 1.0 or job.gpu_memory_mb is not None):  # (a fraction)
            return False
        return not self.config.consolidate or job.gpus <= self.widest_host.get(job.gpu_type, 0)

    def _choose_free(self, job: PendingJob) -> tuple[int, ...] | None:
        """choose_gpus on the free GPUs for a whole-GPU job."""
        # Most jobs of a long queue do not fit: remember the smallest gang that failed since GPUs last came back.
        # (Only for single-host gangs when consolidating: a wider gang may fit across hosts where a narrower
        # one found no host.)
        hosts = self.free.hosts_for(job)
        monotone = hosts is None and (not self.config.consolidate or job.gpus <= self.widest_host.get(job.gpu_type, 0))
        failed = self.no_fit.get(job.gpu_type)
        if monotone and failed is not None and failed[0] == self.free.version and job.gpus >= failed[1]:
            return None
        chosen = choose_gpus(self.free, job.gpus, job.gpu_type, self.config.consolidate, hosts)
        if chosen is None and monotone:
            self.no_fit[job.gpu_type] = (self.free.version, job.gpus)
        return chosen

    def _choose_whole(self, job: PendingJob, remaining_s: float) -> tuple[int, ...] | None:
        chosen = self._choose_free(job)
        reservation = self.reservation
        if chosen is not None or reservation is None or not reservation.held:
            return chosen
        if self.now + remaining_s > reservation.start:
            return None
        hosts = self.free.hosts_for(job)
        # Ends before the head's reserved start: it may use the reserved GPUs meanwhile.
        held = list(reservation.held)
        self.free.give(held)
        chosen = choose_gpus(self.free, job.gpus, job.gpu_type, self.config.consolidate, hosts)
        self.free.take(g for g in held if chosen is None or g not in chosen)
        if chosen is not None:
            reservation.held.difference_update(chosen)  # they stay in the pool: _commit takes them
        return chosen

    def _commit(self, job: PendingJob, choice: Choice, borrowing: bool, remaining_s: float) -> None:
        gpu_ids, units = choice
        memory = job.gpu_memory_mb or 0
        if units == FULL and not is_fractional(job):
            self.free.take(gpu_ids)
            share = 1.0
        else:
            self.free.take_share(gpu_ids[0], units, memory)
            share = units / FULL
        self.team_held[job.team] += units * len(gpu_ids)
        self.user_held[(job.team, job.user)] += units * len(gpu_ids)
        self.placements.append(Placement(job.job_id, gpu_ids, borrowing, share))
        self.placed_ends.append((self.now + remaining_s, gpu_ids, job.team, units, memory))
        self.placed_jobs.append((job, remaining_s, units))

    def _release(self, state: RunState) -> None:
        gpu_ids = state.job.gpu_ids
        reservation = self.reservation
        if is_fractional(state.job):
            for gpu_id in gpu_ids:
                reserved = reservation is not None and gpu_id in reservation.gpu_ids
                emptied = self.free.give_share(gpu_id, state.units, state.job.gpu_memory_mb or 0, not reserved)
                if emptied and reserved:
                    reservation.held.add(gpu_id)  # type: ignore[union-attr]
            return
        if reservation is None:
            self.free.give(gpu_ids)
            return
        self.free.give(g for g in gpu_ids if g not in reservation.gpu_ids)
        reservation.held.update(g for g in gpu_ids if g in reservation.gpu_ids and g in self.free.location)

    def _recapture(self, state: RunState) -> None:
        reservation = self.reservation
        for gpu_id in state.job.gpu_ids:
            if reservation is not None and gpu_id in reservation.held:
                reservation.held.discard(gpu_id)
                if is_fractional(state.job):
                    self.free.take_share(gpu_id, state.units, state.job.gpu_memory_mb or 0)
            elif is_fractional(state.job):
                if gpu_id in self.free.location:
                    self.free.take_share(gpu_id, state.units, state.job.gpu_memory_mb or 0)
            elif self.free.is_free(gpu_id):
                self.free.take((gpu_id,))

    def _try_preempt(
        self, job: PendingJob, score: float, remaining_s: float, within_quota: bool, quota_room_needed: int
    ) -> bool:
        if self.searches >= self.config.max_preemption_searches or not self.states:
            return False
        stoppable = self.victim_index.stoppable_gpus(job, score, within_quota, self.config)
        if stoppable == 0 or stoppable + self.free.count(job.gpu_type) < job.gpus:
            return False
        self.searches += 1
        candidates = self.candidates.get(job.team)
        if candidates is None:
            candidates = self.candidates[job.team] = victim_candidates(self.states, job.team)
        plan = plan_preemption(
            job, score, within_quota, quota_room_needed, self.states, self.free, self.config, self.sharers, candidates
        )
        if plan is None:
            return False
        for state, _ in plan.victims:
            state.stopped = True
            self._release(state)
            self.team_held[state.job.team] -= state.held
            self.user_held[(state.job.team, state.job.user)] -= state.held
        chosen = self._choose(job, remaining_s)
        if chosen is None or not self._quota_allows(job, chosen):
            # The reservation kept GPUs the plan counted on, or a memory request took more of the GPU than the
            # quota has room for: undo.
            for state, _ in plan.victims:
                state.stopped = False
                self._recapture(state)
                self.team_held[state.job.team] += state.held
                self.user_held[(state.job.team, state.job.user)] += state.held
            return False
        for state, kind in plan.victims:
            reason = PREEMPTION_REASONS[kind].format(
                team=state.job.team, job=job.job_id, other=job.team, priority=job.priority.name.lower()
            )
            self.preemptions.append(Preemption(state.job.job_id, reason, for_job=job.job_id))
            self.victim_index.remove(state)
        self._commit(job, chosen, False, remaining_s)
        return True

    def _defragment(self, job: PendingJob, score: float, remaining_s: float) -> bool:
        """Place gang `job` by moving a few running jobs off the hosts it needs (defrag.py), when enough GPUs of its
        type are free but not on the fewest hosts. The moved jobs are stopped (checkpointed) as victims are: they
        wait again at their place in the order, and a later pass starts them where GPUs are free (the plan made sure
        some are, off the gang's hosts)."""
        if (
            not self.config.defragment
            or job.gpus <= 1
            or is_fractional(job)
            or self.free.count(job.gpu_type) < job.gpus
            or (self.reservation is not None and self.reservation.held)
        ):
            return False
        self.defrag_searches += 1
        plan = plan_defrag(job, score, self.states, self.free, self.config.consolidate, self.config.max_defrag_moves)
        if plan is None:
            return False
        reason = MOVED.format(job=job.job_id, gpus=job.gpus)
        self.defrag_moves += len(plan.moves)
        for move in plan.moves:
            self._stop(move.state, Preemption(move.state.job.job_id, reason, for_job=job.job_id, moved=True))
        self._commit(job, (plan.gang, FULL), False, remaining_s)
        return True

    def _quota_allows(self, job: PendingJob, choice: Choice) -> bool:
        quota = self.snapshot.quotas[job.team]
        units = choice[1] * len(choice[0])
        cap = quota.user_max_gpus.get(job.user)
        if cap is not None and self.user_held[(job.team, job.user)] + units > FULL * cap:
            return False
        return self.team_held[job.team] + units <= FULL * quota.max_gpus

    # -- reservation --------------------------------------------------------------------------------------
    def _reserve(self, job: PendingJob, quota_room_needed: int) -> Reservation | None:
        """GPUs for `job` at the earliest predicted time that they are free and its team is back under quota."""
        timeline = sorted(self._running_releases() + self.placed_ends, key=lambda item: item[0])
        scratch = self.free.copy()
        team_freed = 0
        for end, gpu_ids, team, units, memory in timeline:
            if units == FULL and gpu_ids and gpu_ids[0] not in scratch.used:
                scratch.give(gpu_ids)
            else:
                for gpu_id in gpu_ids:
                    scratch.give_share(gpu_id, units, memory)
            if team == job.team:
                team_freed += units * len(gpu_ids)
            if team_freed < quota_room_needed or scratch.count(job.gpu_type) < job.gpus:
                continue
            chosen = choose_gpus(scratch, job.gpus, job.gpu_type, self.config.consolidate, scratch.hosts_for(job))
            if chosen is not None:
                reserved = frozenset(chosen)
                held = {g for g in chosen if self.free.is_free(g)}
                self.free.take(held)
                return Reservation(job.job_id, end, reserved, held)
        return None

    def _running_releases(self) -> list[Release]:
        return [
            (self.now + s.remaining_s, s.job.gpu_ids, s.job.team, s.units, s.job.gpu_memory_mb or 0)
            for s in self.states
            if not s.stopped
        ]

    def _fraction_fence(self, ordered: list[Ranked]) -> Fence | None:
        """GPUs kept from fractions for the first whole-GPU job (of the first FENCE_SCAN within quota) that can
        start now, or could if the GPUs that fractions hold were empty. Without the first case, fractions ahead
        of it in the queue would take the GPUs again the moment they drain."""
        scratch = self.free
        if self.free.used:
            scratch = self.free.copy()
            for gpu_id in list(scratch.used):
                scratch.give_share(gpu_id, scratch.used[gpu_id], scratch.memory_used.get(gpu_id, 0))
        scanned = 0
        for _, _, _, _, job, _, _, _ in ordered:
            if is_fractional(job):
                continue
            scanned += 1
            if scanned > FENCE_SCAN:
                break
            quota = self.snapshot.quotas.get(job.team)
            if quota is None or (
                self.team_held[job.team] + FULL * job.gpus > FULL * quota.max_gpus and not quota.may_borrow
            ):
                continue
            hosts = self.free.hosts_for(job)
            chosen = choose_gpus(self.free, job.gpus, job.gpu_type, self.config.consolidate, hosts)
            if chosen is None and scratch is not self.free:
                chosen = choose_gpus(scratch, job.gpus, job.gpu_type, self.config.consolidate, hosts)
            if chosen is not None:
                return Fence(job.job_id, int(job.priority), frozenset(chosen))
        return None

    # -- the pass -----------------------------------------------------------------------------------------
    def _capacity_reason(self, job: PendingJob) -> tuple[str, str] | None:
        if job.gpu_type is not None:
            total = self.schedulable_total.get(job.gpu_type, 0)
            if total == 0:
                return "no_gpu_type", f"no schedulable GPU of type {job.gpu_type} in the cluster"
        else:
            total = max(self.schedulable_total.values(), default=0)
        where = "the cluster has"
        need = host_need(job)
        if need is not None:
            if not self.free.need_hosts[need.key]:
                return "no_runtime", need.no_host
            totals = self.need_total[need.key]
            total = totals.get(job.gpu_type, 0) if job.gpu_type else max(totals.values(), default=0)
            where = f"{need.hosts} have"
        if job.gpus > total:
            kind = _type_label(job.gpu_type)
            return "too_large", f"asks for {job.gpus} GPUs{kind}; {where} {total} schedulable"
        if is_fractional(job) and job.gpu_memory_mb is not None:
            types = {job.gpu_type} if job.gpu_type else set(self.schedulable_total)
            memories = [m for g, m in self.free.memory.items() if self.free.location[g][1] in types]
            if memories and all(0 < m < job.gpu_memory_mb for m in memories):
                return "too_large", (
                    f"asks for {job.gpu_memory_mb} MB on one GPU{_type_label(job.gpu_type)}; the largest has "
                    f"{max(memories)} MB"
                )
        return None

    def _stop_over_budget(self) -> None:
        """Stop every running job of a team whose budget is spent and that asked for its jobs to be stopped."""
        for state in self.states:
            quota = self.snapshot.quotas.get(state.job.team)
            if quota is None or not (quota.budget_spent and quota.stop_when_spent) or state.stopped:
                continue
            self._stop(state, Preemption(state.job.job_id, BUDGET_STOP.format(team=state.job.team)))

    def _stop(self, state: RunState, preemption: Preemption) -> None:
        """Stop a running job for good in this pass: its GPUs and quota back, out of the victims, `preemption` sent."""
        state.stopped = True
        self._release(state)
        self.team_held[state.job.team] -= state.held
        self.user_held[(state.job.team, state.job.user)] -= state.held
        self.victim_index.remove(state)
        self.preemptions.append(preemption)

    def run(self) -> Decisions:
        self._running_states()
        self._stop_over_budget()
        ordered = self._ranked()
        if _any_fraction(self.snapshot.pending):
            self.fence = self._fraction_fence(ordered)

        waiting: list[Explained] = []
        # The replay's queue (estimate.start_times): the waiting jobs that may get an estimate, in pass order, as
        # _waiting_entry makes them (with what it looks up once per job looked up once per team: ten thousand
        # jobs; a waiting job's prediction as it is is never above its remaining time, min() there).
        queue: list[Waiting] = []
        borrowing = self.config.borrowing
        lends = {team: borrowing and quota.may_borrow for team, quota in self.snapshot.quotas.items()}
        max_preemptions = self.config.max_preemptions_per_job
        higher_class_waiting: dict[int, int] = defaultdict(int)
        counted = 0  # (the sum of its values)
        place_or_explain = self._place_or_explain
        # the first waiting jobs the replay may start (the ones it time-slices: _with_slices)
        sliceable: list[PendingJob] = []
        for negative_priority, score, submitted_at, job_id, job, remaining, expected, confidence in ordered:
            code_reason = place_or_explain(job, score, remaining, higher_class_waiting, counted)
            if code_reason is None:  # (placed: its figures are looked up by job id from here on)
                self.scores[job_id], self.expected[job_id], self.confidence[job_id] = score, expected, confidence
                continue
            code, reason = code_reason
            waiting.append((job, remaining, code, reason))
            if code in NO_ESTIMATE:
                continue
            queue.append(Waiting(
                job_id, (negative_priority, score, submitted_at, job_id), job.team, job.user, job.gpus, job.gpu_type,
                min_units(job) if is_fractional(job) else FULL * job.gpus,
                expected, confidence,
                not (lends.get(job.team, False) and job.preemptible and job.preemption_count < max_preemptions),
                aging_s=job_aging_s(job, self.config), declared=job.declared_steps is not None,
            ))
            if len(sliceable) < HELD_JOBS:
                sliceable.append(job)
            if code not in OWN_LIMIT:
                higher_class_waiting[-negative_priority] += 1
                counted += 1
        self._explain(waiting, self._with_head(self._with_slices(queue, sliceable)))
        # GPUs freed by preemption may now fit jobs examined before them, and a job moved for a gang has GPUs free
        # elsewhere: ask to be called again at once.
        wake_at = self.now if self.preemptions and (self.pending or self.defrag_moves) else self._wake_at()
        return Decisions(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            pending=self.pending,
            wake_at=wake_at,
        )

    def _place_or_explain(
        self, job: PendingJob, score: float, remaining: float, higher_class_waiting: dict[int, int], counted: int
    ) -> tuple[str, str] | None:
        """None when `job` is placed (or stops victims), else why it waits: (code, reason). `higher_class_waiting`:
        class -> jobs of that class found waiting so far (`counted` in all)."""
        config = self.config
        quota = self.quotas.get(job.team)
        if quota is None:
            return "no_quota", f"team {job.team} has no GPU quota"
        if quota.budget_spent:
            return "budget", budget_reason(job.team)
        capacity_key = (job.gpu_type, job.gpus, job.gpu_memory_mb, job.needs_containers, job.needs_own_uid)
        try:
            capacity = self.capacity_reasons[capacity_key]
        except KeyError:
            capacity = self.capacity_reasons[capacity_key] = self._capacity_reason(job)
        if capacity is not None:
            return capacity
        fractional = is_fractional(job)
        need = min_units(job) if fractional else FULL * job.gpus
        user_cap = quota.user_max_gpus.get(job.user) if quota.user_max_gpus else None  # (most teams cap no one)
        user_held = self.user_held[(job.team, job.user)] if user_cap is not None else 0  # (read only with a cap)
        if user_cap is not None and user_held + need > FULL * user_cap:
            return (
                "user_cap",
                f"user {job.user} uses {fmt_gpus(user_held)} of the {user_cap} GPUs allowed in team {job.team}",
            )
        held = self.team_held[job.team]
        over_quota = held + need - FULL * quota.max_gpus
        quota_room_needed = over_quota if over_quota > 0 else 0
        within_quota = quota_room_needed == 0
        may_borrow = (
            config.borrowing
            and quota.may_borrow
            and job.preemptible
            and job.preemption_count < config.max_preemptions_per_job
        )
        if (within_quota or may_borrow) and not self._known_no_fit(job):
            chosen = self._choose(job, remaining)
            if chosen is not None:
                # A memory request may take more units on the chosen GPU than the least the quota check assumed.
                over = held + chosen[1] * len(chosen[0]) > FULL * quota.max_gpus
                cap_over = user_cap is not None and user_held + chosen[1] > FULL * user_cap
                if not cap_over and (not over or may_borrow):
                    self._commit(job, chosen, over, remaining)
                    return None
        if self.searches < config.max_preemption_searches and self._try_preempt(
            job, score, remaining, within_quota, quota_room_needed
        ):
            return None
        if (
            within_quota
            and self.defrag_searches < config.max_defrag_searches
            and self._defragment(job, score, remaining)
        ):
            return None
        if not within_quota:
            if may_borrow:
                # (the reason made once, looked up here first: thousands of jobs)
                reason = self.borrow_reasons.get((job.team, held, quota.max_gpus))
                return "borrow", reason or self._borrow_reason(job.team, held, quota.max_gpus)
            # The quota is what stops it only if the GPUs are there (a team alone on the cluster hits both).
            if self._fits_now(job):
                return "quota", f"team {job.team} uses {fmt_gpus(held)} of its {quota.max_gpus} GPUs (quota)"
        if (
            self.reservation is None
            and config.backfill
            and self.now - job.submitted_at >= config.reserve_after_wait_s
        ):
            self.reservation = self._reserve(job, quota_room_needed)
            if self.reservation is not None:
                return "reserved", (
                    f"next to start: {job.gpus} GPUs{_type_label(job.gpu_type)} reserved for it as running jobs end"
                )
        # Jobs come highest class first: those counted so far are of its class or higher.
        ahead = counted - higher_class_waiting.get(job.priority, 0)  # (an IntEnum: the int's key)
        if ahead:
            return "priority", self.behind_reasons.get(ahead) or self._behind(ahead)
        if fractional:
            return self._explain_fraction(job)
        free_now = self.free.count(job.gpu_type)
        head = self.reservation
        if (
            head is not None
            and head.held
            and free_now + len(head.held) >= job.gpus
            and self._fits_with(head.held, job)
        ):
            return "backfill", (
                f"the free GPUs are reserved for job {head.job_id}, due to start in "
                f"{_fmt_hours(head.start - self.now)}; this job would not end before then (backfill)"
            )
        if free_now >= job.gpus:
            return "gang", (
                f"gang of {job.gpus} GPUs{_type_label(job.gpu_type)} does not fit: {free_now} free, "
                f"at most {self.free.largest_block(job.gpu_type)} on one host"
            )
        return "waiting", (
            f"waiting for {job.gpus} GPUs{_type_label(job.gpu_type)} ({free_now} free now); "
            f"jobs ahead are predicted to finish sooner or have higher priority"
        )

    def _borrow_reason(self, team: str, held: int, max_gpus: int) -> str:
        """The reason of a job waiting to borrow (the same for a team's jobs until it holds more: made once)."""
        key = (team, held, max_gpus)
        reason = self.borrow_reasons.get(key)
        if reason is None:
            reason = self.borrow_reasons[key] = (
                f"team {team} uses {fmt_gpus(held)} of its {max_gpus} GPUs; waiting for idle GPUs to borrow"
            )
        return reason

    def _behind(self, ahead: int) -> str:
        """The reason of a job behind `ahead` waiting jobs of higher classes (the same for a whole class: made once)."""
        reason = self.behind_reasons.get(ahead)
        if reason is None:
            reason = self.behind_reasons[ahead] = f"behind {ahead} higher-priority jobs waiting for GPUs"
        return reason

    def _fits_now(self, job: PendingJob) -> bool:
        if is_fractional(job):
            return self.free.choose_share(job, min_units(job)) is not None
        return self._choose_free(job) is not None

    def _explain_fraction(self, job: PendingJob) -> tuple[str, str]:
        keeper = self.fence or self.reservation
        if keeper is not None and self._fits_now(job):
            return "waiting", (
                f"waiting for {_asked(job)}{_type_label(job.gpu_type)}: the GPUs with room are kept for whole-GPU "
                f"job {keeper.job_id}, which fractions must not block"
            )
        return "waiting", (
            f"waiting for {_asked(job)}{_type_label(job.gpu_type)}: no GPU has that much room now; "
            f"jobs ahead are predicted to finish sooner or have higher priority"
        )

    def _fits_with(self, extra: set[int], job: PendingJob) -> bool:
        # (whole-GPU jobs only)
        self.free.give(extra)
        fits = choose_gpus(self.free, job.gpus, job.gpu_type, self.config.consolidate,
                           self.free.hosts_for(job)) is not None
        self.free.take(extra)
        return fits

    def _explain(self, waiting: list[Explained], queue: list[Waiting]) -> None:
        capacity = dict(self.schedulable_total)
        free_by_type = {t: self.free.totals.get(t, 0) for t in capacity}
        if self.reservation is not None:
            for gpu_id in self.reservation.held:
                gpu_type = self.free.location[gpu_id][1]
                free_by_type[gpu_type] = free_by_type.get(gpu_type, 0) + 1
        quotas = self.snapshot.quotas
        team_room = {team: FULL * q.max_gpus - self.team_held[team] for team, q in quotas.items()}
        user_room = {
            (team, user): FULL * cap - self.user_held[(team, user)]
            for team, q in quotas.items()
            for user, cap in q.user_max_gpus.items()
        }
        config = self.config

        def may_stop(job: Waiting, victim: Waiting) -> bool:
            ratio = stop_ratio(job.gpus, job.declared, victim.gpus, victim.declared, config)
            return outranks(-job.order[0], job.order[1], -victim.order[0], victim.order[1], config, ratio) is not None

        starts = start_times(
            self.now, free_by_type, capacity, team_room, user_room, self._ends(queue), queue,
            expected_arrivals(self.now, self._recent(queue)), may_stop,
        )
        pending = self.pending
        # confidence -> rounded to 2 places: round() goes through a decimal string, and a pass has few confidences
        rounded: dict[float, float] = {}
        for position, (job, remaining, code, reason) in enumerate(waiting, start=1):
            estimate = starts.get(job.job_id)
            if code == "waiting" and position == 1:
                reason = self._agreeing_reason(code, reason, position)
            if estimate is None:
                pending[job.job_id] = PendingInfo(reason, position, None, code, remaining, None)
            else:
                start, sure = estimate
                # (0.0 and -0.0, one key for a dict, round to themselves)
                confidence = rounded.get(sure) if sure else sure
                if confidence is None:
                    confidence = rounded[sure] = round(sure, 2)
                pending[job.job_id] = PendingInfo(reason, position, start, code, remaining, confidence)

    def _recent(self, queue: list[Waiting]) -> list[Waiting]:
        """The jobs submitted in the last day (waiting, placed in this pass, or running), as the replay's entries:
        estimate.expected_arrivals finds the sweep going on among them."""
        since = self.now - RECENT_S

        def entry(job: PendingJob | RunningJob, remaining: float) -> Waiting:
            order = (-int(job.priority), self._score(job, remaining), job.submitted_at, job.job_id)
            return self._waiting_entry(job, remaining, order)

        recent = [w for w in queue if w.order[2] >= since]
        recent += [entry(job, remaining) for job, remaining, _ in self.placed_jobs if job.submitted_at >= since]
        recent += [entry(s.job, s.remaining_s) for s in self.states if not s.stopped and s.job.submitted_at >= since]
        return recent

    def _agreeing_reason(self, code: str, reason: str, position: int) -> str:
        """The reason, told so that it agrees with the position beside it."""
        if code == "waiting" and position == 1:
            return reason.replace(
                "jobs ahead are predicted to finish sooner or have higher priority",
                "first in the queue; it starts as running jobs end",
            )
        return reason

    def _waiting_entry(self, job: PendingJob | RunningJob, remaining: float, order: Order) -> Waiting:
        lends = self.team_lends.get(job.team)  # (the team may borrow at all: once per team and pass)
        if lends is None:
            quota = self.snapshot.quotas.get(job.team)
            lends = self.team_lends[job.team] = quota is not None and self.config.borrowing and quota.may_borrow
        may_borrow = lends and job.preemptible and job.preemption_count < self.config.max_preemptions_per_job
        units = FULL * job.gpus if not is_fractional(job) else min_units(job)
        return Waiting(
            job.job_id, order, job.team, job.user, job.gpus, job.gpu_type, units,
            min(remaining, self.expected.get(job.job_id, remaining)), self.confidence.get(job.job_id, 0.0),
            not may_borrow, aging_s=job_aging_s(job, self.config), declared=job.declared_steps is not None,
        )

    def _with_slices(self, queue: list[Waiting], jobs: list[PendingJob]) -> list[Waiting]:
        """The replay's queue with, for its first jobs (`jobs`, in queue order), when each once started would move on
        to its next attained-service queue (no earlier than its protection allows) and its order there, if its
        team's best waiting job now would then outrank it: the replay stops it again for a waiting job that may
        (Waiting.slice_s), as shortest-first over attained service time-slices jobs that declare nothing. Without
        this a job at place 34 of trace4 was told 25 h and started after 31 minutes.

        A job given a slice that declares nothing, and whose program's runs do not foretell its runs
        (_foretold_by_its_program), holds its GPUs in the replay at least as long as the cluster's finished runs
        that outlasted what it has run say it holds them until it may be stopped (RuntimeHistory.expected_hold_s),
        and so does a running one (_ends): its prediction is median-like, and where most runs take minutes and a
        few days (trace4) it said that each of the hundreds of jobs of a burst ahead would hold its GPU three
        minutes, where they held it about twenty: told 19 minutes, started after 77. For such a job the slice is
        looked for past the next queue too (moved on to the next it may not be outranked yet, and further on be:
        trace4's floors at 3 min, 15 min and 31 h), for the first HELD_JOBS; the replay stops only the first
        SLICED_JOBS (the estimates of the others, and of every job that declares, are as before: some 4 ms less a
        pass). Estimate lab (benchmarks/estimate_lab.py), median error of the wait without declarations: trace4
        0.76 -> 0.46, trace3 0.25 -> 0.17; with exact ones the same. Only a hold with an end: one that may never be
        stopped would be held for the mean of a heavy tail (days), where most end in minutes (trace4: 0.46 -> 2.9)."""
        config = self.config
        if not (jobs and config.srpt_preemption and config.ordering == "shortest-remaining"):
            return queue
        history = self.snapshot.history or EMPTY_HISTORY
        queues = history.service_queues(SERVICE_QUANTILES)
        top_class, best_score = _firsts(queue, {job.team for job in jobs})
        slices: dict[int, tuple[float, Order]] = {}
        holds: dict[int, float] = {}
        for n, job in enumerate(jobs):
            held = job_gpus_held(job)
            # (a job of unknown length: it declares nothing, and its program's runs have not foretold its runs)
            unknown = job.declared_steps is None and not _foretold_by_its_program(job, history)
            if held <= 0 or not job.preemptible or (n >= SLICED_JOBS and not unknown):
                continue
            elapsed = job.attained_gpu_seconds / held
            index = service_estimate(job, self.now, history)[1] if elapsed else 0
            later = queues[index + 1:] if unknown else queues[index + 1:index + 2]
            sliced = self._slice(job, held, elapsed, later, history, top_class, best_score)
            if sliced is not None and n < SLICED_JOBS:
                slices[job.job_id] = sliced
            if sliced is not None and unknown:
                hold = history.expected_hold_s(elapsed, elapsed + sliced[0])
                if hold is not None:
                    holds[job.job_id] = hold
        if not slices and not holds:
            return queue
        changed = []
        for w in queue:
            sliced, hold = slices.get(w.job_id), holds.get(w.job_id)
            if hold is not None and hold > w.runtime_s:
                w = replace(w, runtime_s=hold)
            if sliced is not None:
                w = replace(w, slice_s=sliced[0], moved_order=sliced[1])
            changed.append(w)
        return changed

    def _slice(
        self, job: PendingJob, held: float, elapsed: float, later: tuple[ServiceQueue, ...],
        history: RuntimeHistory, top_class: dict[str, int], best_score: dict[tuple[str, int], float],
    ) -> tuple[float, Order] | None:
        """(run time, order then) of the job once started, when it reaches the first of the `later` queues where
        its team's best waiting job now would outrank it (preemption.outranks); None if none would."""
        step = job.observed_step_s
        # A job that never ran is, moved on, what any like it would be (a waiting job's estimate does not depend on
        # the moment): looked up once for the hundreds of a sweep.
        alike = (
            (job.user, job.similarity_key, held, job.declared_steps, step, job.time_limit_s)
            if not elapsed and not job.steps_done else None
        )
        for n, service_queue in enumerate(later):
            run_s = service_queue.floor - elapsed
            at = self.now + run_s
            remaining = self.moved_remaining.get((alike, n)) if alike is not None else None
            if remaining is None:
                moved = replace(
                    job,
                    # (a hair past the floor: floor x GPUs / GPUs may round below it, and the job stay where it is)
                    attained_gpu_seconds=service_queue.floor * held * (1.0 + 1e-9),
                    steps_done=job.steps_done + int(run_s / step) if step else job.steps_done,
                )
                remaining = service_estimate(moved, at, history)[0]
                if alike is not None:
                    self.moved_remaining[(alike, n)] = remaining
            score = self._service_score(job, at, remaining)
            if self._outranked(job.team, int(job.priority), score, top_class, best_score):
                order = (-int(job.priority), score, job.submitted_at, job.job_id)
                return max(run_s, protected_run_s(job.preemption_count, self.config)), order
        return None

    def _with_head(self, queue: list[Waiting]) -> list[Waiting]:
        """The replay's queue (made in run) with the reserved head's start fixed."""
        head = self.reservation
        if head is None:
            return queue
        # The reserved head starts when its GPUs are predicted free, as sure as the least sure running job's end.
        sure = min((self.confidence.get(s.job.job_id, 0.0) for s in self.states if not s.stopped), default=1.0)
        return [
            replace(w, fixed_start=head.start, fixed_confidence=sure) if w.job_id == head.job_id else w for w in queue
        ]

    def _stoppable_at(self, queue: list[Waiting]) -> dict[int, tuple[float, float | None]]:
        """Running job id -> when a waiting job may stop it (preemption.py's rules for its own team: a higher
        class, a much shorter job of its class, or a wide gang at its lower bar: _outranked_by_gang), no earlier
        than its minimum run time allows, and its score then if it is not its score now (it will have moved on to
        a longer attained-service queue). With the gangs' bar here and in the replay (may_stop), Muri trace3 with
        exact declarations: the 32-GPU jobs' median error of the wait 0.547 -> 0.498 (all jobs 0.313 either way,
        within a quarter 45 -> 46 %)."""
        config = self.config
        candidates = [state for state in self.states if not state.stopped and state.job.preemptible]
        top_class, best_score = _firsts(queue, {state.job.team for state in candidates})
        gangs = _declared_gangs(queue, config) if config.srpt_preemption else {}
        stoppable: dict[int, tuple[float, float | None]] = {}
        for state in candidates:
            running = state.job
            priority = int(running.priority)
            shorter = best_score.get((running.team, priority))
            outranked = self._outranked(running.team, priority, state.score, top_class, best_score) or (
                running.declared_steps is not None and _outranked_by_gang(gangs, running, state.score, config)
            )
            protection_ends = running.started_at + protected_run_s(running.preemption_count, config)
            if outranked:
                stoppable[running.job_id] = (max(self.now, protection_ends), None)
            elif shorter is not None and config.srpt_preemption and config.ordering == "shortest-remaining":
                moves_on = self._outranked_after_moving_on(state, config.srpt_preempt_ratio * shorter)
                if moves_on is not None:
                    stoppable[running.job_id] = (max(moves_on[0], protection_ends), moves_on[1])
        return stoppable

    def _outranked(
        self, team: str, priority: int, score: float, top_class: dict[str, int],
        best_score: dict[tuple[str, int], float],
    ) -> bool:
        """Whether a waiting job of the team (its top class and best scores: _firsts) may stop a job of that class
        and score: a higher class, or a much shorter job of its class (preemption.outranks)."""
        config = self.config
        shorter = best_score.get((team, priority))
        return (
            outranks(top_class.get(team, -1), 0.0, priority, score, config) == PRIORITY
            or (shorter is not None and outranks(priority, shorter, priority, score, config) is not None)
        )

    def _outranked_after_moving_on(self, state: RunState, bar: float) -> tuple[float, float] | None:
        """When a running job, not a victim now, has a score past `bar` (a waiting job of its team and class that
        much shorter may then stop it), and its score then, looked at as it moves on to each next attained-service
        queue and as its run time doubles in between; None if not before its predicted end (nor for a job in the
        last queue: no moment is looked at)."""
        service = self.service.get(state.job.job_id)
        if service is None or service.next_floor is None:
            return None
        job = state.job
        queues = (self.snapshot.history or EMPTY_HISTORY).service_queues(SERVICE_QUANTILES)
        held = job_gpus_held(job)
        if held <= 0:
            return None
        attained = attained_gpu_seconds(job, self.now)
        ends = self.now + state.remaining_s
        # The moments it crosses the next floors, and moments its run time doubles in between: similar runs
        # that outlasted its run so far (and the overrun rule) raise its score between floors too.
        moments = {self.now + max(0.0, queue.floor * held - attained) / held for queue in queues[service.queue + 1:]}
        ran = SCORE_PROBE_S
        while job.started_at + ran <= self.now:
            ran *= 2
        while len(moments) < MAX_SCORE_PROBES:
            moments.add(job.started_at + ran)
            ran *= 2
        for at in sorted(moments)[:MAX_SCORE_PROBES]:
            if at >= ends:
                return None
            if at <= self.now:
                continue
            # (the order's estimate as the pass then will make it: ordering.service_estimate at that moment)
            score = self._service_score(job, at, service_estimate(job, at, self.snapshot.history or EMPTY_HISTORY)[0])
            if score > bar:
                return at, score
        return None

    def _ends(self, queue: list[Waiting]) -> list[EndsAt]:
        """When running jobs (and those placed in this pass) give their GPUs and quota back: at their predicted
        end, or when they may be stopped (then they wait again for the rest). A GPU shared by fractions comes
        back when the last of them ends."""
        stoppable = self._stoppable_at(queue)
        history = self.snapshot.history or EMPTY_HISTORY
        ends: list[EndsAt] = []
        shared_end: dict[int, tuple[float, float]] = {}
        holders: list[tuple[PendingJob | RunningJob, float, int, tuple[int, ...]]] = [
            (s.job, s.remaining_s, s.units if is_fractional(s.job) else FULL, s.job.gpu_ids)
            for s in self.states
            if not s.stopped
        ]
        placed = {p.job_id: p.gpu_ids for p in self.placements}
        holders += [(job, remaining, units, placed[job.job_id]) for job, remaining, units in self.placed_jobs]
        for job, remaining, units, gpu_ids in holders:
            remaining = min(remaining, self.expected.get(job.job_id, remaining))
            confidence = self.confidence.get(job.job_id, 0.0)
            stop_from, score_then = stoppable.get(job.job_id, (None, None))
            if stop_from is not None and job.declared_steps is None and not _foretold_by_its_program(job, history):
                # (as a waiting job's, _with_slices: what a job that has run as long holds until it may be stopped)
                elapsed = elapsed_run_s(job, self.now)
                hold = history.expected_hold_s(elapsed, elapsed + stop_from - self.now)
                if hold is not None and hold > remaining:
                    remaining = hold
            end = self.now + remaining
            requeue = None
            fractional = units < FULL
            if stop_from is not None and stop_from < end:
                left = remaining - (stop_from - self.now)
                score = self._score(job, left) if score_then is None else score_then
                order = (-int(job.priority), score, job.submitted_at, job.job_id)
                requeue = self._waiting_entry(job, left, order)
                if fractional or (gpu_ids and gpu_ids[0] in self.free.used):
                    end, confidence, stop_from = stop_from, 1.0, None  # (on a shared GPU: stopped then)
            else:
                stop_from = None
            team_units = units * len(gpu_ids)
            if fractional or (gpu_ids and gpu_ids[0] in self.free.used):
                # quota back at its own end; the GPU when the last fraction on it ends
                ends.append(EndsAt(end, None, 0, job.team, job.user, team_units, confidence, requeue))
                for gpu_id in gpu_ids:
                    last, sure = shared_end.get(gpu_id, (end, confidence))
                    shared_end[gpu_id] = (max(end, last), min(sure, confidence))
                continue
            counts: dict[str, int] = defaultdict(int)
            for gpu_id in gpu_ids:
                where = self.free.location.get(gpu_id)
                if where is not None:
                    counts[where[1]] += 1
            if not counts:  # on GPUs that take no new jobs: only the quota comes back
                if stop_from is not None:
                    end, confidence = stop_from, 1.0
                ends.append(EndsAt(end, None, 0, job.team, job.user, team_units, confidence, requeue))
                continue
            first = True
            for gpu_type, n in counts.items():
                # (a job a waiting job may stop: the replay stops it then only for a job its GPUs let start)
                ends.append(EndsAt(end, gpu_type, n, job.team, job.user, team_units if first else 0, confidence,
                                   requeue if first else None, stop_from if first else None))
                first = False
        for gpu_id, (end, confidence) in shared_end.items():
            where = self.free.location.get(gpu_id)
            if where is not None:
                ends.append(EndsAt(end, where[1], 1, "", "", 0, confidence))
        return ends

    def _wake_at(self) -> float | None:
        if not self.pending:
            return None
        # Only worth waking when a waiting job could then preempt: shortest-first, or a higher class waiting.
        waiting_top = max(
            (int(j.priority) for j in self.snapshot.pending if j.job_id in self.pending), default=-1
        )
        running_low = min((int(s.job.priority) for s in self.states if not s.stopped), default=99)
        if not (
            self.config.srpt_preemption or (self.config.priority_preemption and waiting_top > running_low)
        ):
            return None
        later = [
            end
            for s in self.states
            if not s.stopped
            and (end := s.job.started_at + protected_run_s(s.job.preemption_count, self.config)) > self.now
        ]
        if self.config.srpt_preemption and self.config.ordering == "shortest-remaining":
            # A running job moving on to the next attained-service queue may become a victim then.
            for s in self.states:
                service = self.service.get(s.job.job_id)
                if s.stopped or service is None or service.next_floor is None:
                    continue
                held = job_gpus_held(s.job)
                attained = attained_gpu_seconds(s.job, self.now)
                if held > 0 and service.next_floor > attained:
                    later.append(self.now + (service.next_floor - attained) / held)
        return min(later, default=None)


def schedule_console(snapshot: Snapshot, config: PolicyConfig) -> Decisions:
    # A pass makes a few hundred thousand small objects, nearly all kept to its end and hardly any in a reference
    # cycle: the cyclic garbage collector's runs meanwhile free nothing and cost about a tenth of a 10,000-job
    # pass. It is paused for the pass (reference counting still frees what the pass drops).
    collecting = gc.isenabled()
    gc.disable()
    try:
        config = with_learned_aging(with_learned_protection(config, snapshot.history), snapshot)
        return ConsolePass(snapshot, config).run()
    finally:
        if collecting:
            gc.enable()
