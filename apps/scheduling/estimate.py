"""Estimated start times for waiting jobs: the pass's queue replayed on the predicted future.

Running jobs free their GPUs at their predicted ends, or earlier when a waiting job may stop them (the caller
applies the preemption rules, minimum run time included, and says when). Waiting jobs are taken in the pass's
order, and at each moment every job that then fits starts, as the pass would start it: enough free GPUs of its
type, and room in its team's quota and its user's cap (a job that may borrow needs only idle GPUs). A job
started in the replay frees its GPUs after its predicted run time. GPUs are counted per type (not per host):
an estimate, not a promise; simulate.py measures how good it is.

Jobs submitted later that go ahead in the queue (shorter ones, under shortest-first) delay a waiting job; on
the Muri traces they are nearly all of the error (told the true next submissions, the replay's median error is
4 % of the wait on trace4). The caller may pass expected submissions: expected_arrivals expects a sweep going
on (many submissions seconds apart) to go on as long again; each joins the replay's queue when it comes.

Running jobs that a waiting job may stop (the caller says from when: after their minimum run time, for a higher
class or a much shorter job of their team, or once they move on to a longer attained-service queue) are stopped
in the replay as the pass's victim search stops them: for the first waiting job that their GPUs then let start,
only as many as it needs, the last ranked first (Release.stop_from, start_times' may_stop). Stopped one at a time
at the moment each became stoppable, each went back to its GPUs at once and the job they were stopped for waited
for their ends: on Muri trace3 the median error was 0.90 of the wait without declarations (now 0.59), 0.35 with
exact ones (now 0.30).

Without declarations, shortest-first over attained service time-slices the queue: a job that starts runs until it
moves on to a longer queue (or its score otherwise passes the bar), and a job that waited behind it stops it. The
pass gives the first waiting jobs that moment and their order then (Waiting.slice_s, moved_order), and the replay
makes each a victim from then on when it starts it (the running jobs' scores are looked at between floors too):
trace3 without declarations 0.43 -> 0.14 of the wait, with exact ones 0.33 -> 0.30; trace4 0.93 -> 0.92 (0.74 with
the pass's _recent: a sweep's expected rest comes behind the jobs like it) and 0.47 -> 0.46.

Each estimate carries a confidence in [0, 1]: the lowest confidence of the predictions whose ends let the job
start at that moment (a replayed job's end is as sure as its start and its own run-time prediction together).

Waiting jobs are kept in buckets of equal demand (type, GPUs, team, user, whether bound by quota), each a list
in reverse queue order (its first job last, taken by pop(): no heap to sift, ten thousand starts a pass); only a bucket's first job can be the next to start. Buckets are offered by the type and GPUs their
first job needs, and parked while their team's quota or user's cap holds it back (estimate_starts), so a start
costs O(log + GPU counts asked for) rather than O(buckets); the replay stops once every queued job has started.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from operator import add, lt

from apps.scheduling.ordering import aging_boost

# The pass's sort key: (-priority, score, submitted at, job id).
Order = tuple[int, float, float, int]


# Waiting is made by the ten thousand in a pass: a plain (not frozen) dataclass, five times cheaper to make on
# CPython 3.11; nothing changes one once made (dataclasses.replace makes changed copies). (The pass takes its
# estimates as start_times' tuples, not Estimates.)
@dataclass(slots=True)
class Waiting:
    job_id: int
    order: Order
    team: str
    user: str
    gpus: int
    gpu_type: str | None
    # Quota units it takes (sharing.FULL per GPU), and whether it must fit in its team's quota (False: it may
    # borrow idle GPUs beyond it).
    units: int
    runtime_s: float
    confidence: float
    quota_bound: bool = True
    # The head of the queue with GPUs reserved for it: it starts then, whatever the jobs behind it do.
    fixed_start: float | None = None
    fixed_confidence: float = 1.0
    # An expected submission (expected_arrivals), not a real job: it takes GPUs in the replay, has no estimate.
    expected: bool = False
    # Once started, it may be stopped after running `slice_s` (it moves on to a longer attained-service queue,
    # where its order is `moved_order`): a waiting job of its team that may stop a job of that order then does
    # (start_times' may_stop), as attained service time-slices a queue of jobs that declare nothing.
    slice_s: float | None = None
    moved_order: Order | None = None
    # The aging time its score was boosted over (ordering.job_aging_s; 0: none), which expected_arrivals undoes.
    aging_s: float = 0.0
    # It declares its steps (the gangs' lower bar to stop a job: preemption.stop_ratio).
    declared: bool = False


@dataclass(frozen=True, slots=True)
class Release:
    """GPUs (of one type) and quota units that a running job gives back at `at`."""

    at: float
    gpu_type: str | None
    gpus: int
    team: str
    user: str
    units: int
    confidence: float
    # A job stopped (preempted) at `at` rather than ending: it waits again for its remaining run time.
    requeue: Waiting | None = None
    # A job that a waiting job of its team ranked before `requeue` may stop from `stop_from` on: it ends at `at`
    # unless such a job needs its GPUs to start before (then it waits again as `requeue`, for what is left).
    stop_from: float | None = None


@dataclass(slots=True)
class Estimate:
    start: float
    confidence: float


# A release in the replay: (gpu type (untyped: the default one), GPUs, team, user, units, confidence, requeue).
# They are kept by moment, each moment's in the order they came (estimate_starts).
_Freed = tuple[str | None, int, str, str, int, float, Waiting | None]
# (at, sequence, a reserved job's start, an expected submission joining the queue): one of the last two
_Event = tuple[float, int, Waiting | None, Waiting | None]
# (gpu type, GPUs, team, user, whether bound by quota): jobs of one demand (see estimate_starts)
_BucketKey = tuple[str, int, str, str, bool]
# (what the bucket's first job needs of the resource, token, bucket number)
_Parked = tuple[int, int, int]
# (the bucket's first job's rank (its order's place among all orders), token, bucket number)
_Offer = tuple[int, int, int]
# A running job a waiting job may stop (Release.stop_from): its release, its rank and order waiting again, and
# its release's entry in the replay (taken out if it is stopped)
_Victim = tuple[Release, int, _Freed, Order]
INFINITY = float("inf")


def estimate_starts(
    now: float,
    free_by_type: dict[str, int],
    capacity_by_type: dict[str, int],
    team_room: dict[str, int],
    user_room: dict[tuple[str, str], int],
    releases: list[Release],
    queue: list[Waiting],
    arrivals: Sequence[tuple[float, Waiting]] = (),
) -> dict[int, Estimate | None]:
    """job id -> its estimated start (None: it never starts on the predicted future, e.g. a job wider than its
    team's quota): start_times' figures as Estimates."""
    starts = start_times(now, free_by_type, capacity_by_type, team_room, user_room, releases, queue, arrivals)
    return {job_id: None if start is None else Estimate(*start) for job_id, start in starts.items()}


def start_times(
    now: float,
    free_by_type: dict[str, int],
    capacity_by_type: dict[str, int],
    team_room: dict[str, int],
    user_room: dict[tuple[str, str], int],
    releases: list[Release],
    queue: list[Waiting],
    arrivals: Sequence[tuple[float, Waiting]] = (),
    may_stop: Callable[[Waiting, Waiting], bool] | None = None,
) -> dict[int, tuple[float, float] | None]:
    """job id -> (its estimated start, the confidence in it) (None: it never starts on the predicted future, e.g. a
    job wider than its team's quota); plain tuples, cheaper to make than ten thousand Estimates. `team_room`: quota
    units each team has left now (may be negative); `user_room`: the same for users with a cap (others have none).
    `arrivals`: (when, job) expected to be submitted (expected_arrivals), each joining the queue then with the
    order it carries. `may_stop(job, victim as it would wait again)`: whether a waiting job may stop a running one of its
    team that a release says it may stop (Release.stop_from); without it, any job ranked before the victim may.

    At each moment the job to start is the first in queue order, among the buckets' first jobs, that fits. The
    buckets are offered by the type and number of GPUs their first job needs, each kind a heap by that job's
    order, so a moment looks at the first offer of each kind that the free GPUs fit (O(kinds), not O(buckets)),
    and only again for a type whose free GPUs or offers changed. A bucket whose first job is held back by its
    team's quota or its user's cap is parked there with the units it needs, and is offered again only once a
    release has given them back (or its first job changed: a start, a submission). Every offer and parking
    carries the bucket's token of the time: a bucket offered or parked again gets a new one, and the entries
    with an old one are skipped."""
    free = {t: free_by_type.get(t, 0) for t in capacity_by_type}
    # (every team that can start or end a job here gets an entry, 0 if none was given: bucket_of, the releases and
    # the reserved starts add theirs, and the replay reads a team's room by subscript, ten thousand times a pass)
    team_room = dict(team_room)
    user_room = dict(user_room)
    # Untyped jobs are counted on the type with the most GPUs (a simplification of "any type").
    default_type = max(capacity_by_type, key=lambda t: (capacity_by_type[t], t), default=None)
    seq = itertools.count()
    heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
    # The releases to come: a heap of their moments (plain floats: ten thousand starts a pass, each pushing one and
    # popping one, compare far cheaper than tuples), and each moment's releases in the order they came.
    freed_by: dict[float, list[_Freed]] = {}
    stoppable: list[tuple[Release, _Freed]] = []
    for r in releases:
        team_room.setdefault(r.team, 0)
        victim = r.stop_from is not None and r.requeue is not None and r.stop_from < r.at and r.gpus > 0
        release = (r.gpu_type or default_type, r.gpus, r.team, r.user, r.units, r.confidence,
                   None if victim else r.requeue)
        freed_by.setdefault(r.at, []).append(release)
        if victim:
            stoppable.append((r, release))
    freed = list(freed_by)
    heapq.heapify(freed)

    def release_at(at: float, release: _Freed) -> None:
        moment = freed_by.get(at)
        if moment is None:
            freed_by[at] = [release]
            heappush(freed, at)
        else:
            moment.append(release)
    events: list[_Event] = [(max(now, at), next(seq), None, replace(job, expected=True)) for at, job in arrivals]
    heapq.heapify(events)
    estimates: dict[int, tuple[float, float] | None] = {}
    # Every order that can join the queue is known now (queued jobs, expected submissions, stopped jobs queued
    # again): the heaps hold each one's rank among them, and compare ints rather than tuples of tuples (equal
    # orders, equal ranks: the same comparisons' outcomes). Equal orders all get the last one's place: ranks may
    # skip numbers, which no comparison sees.
    others = [job.order for _, job in arrivals]
    others += [r.requeue.order for r in releases if r.requeue is not None]
    others += [job.moved_order for job in queue if job.moved_order is not None]
    queue_ranks, rank = _ranks([job.order for job in queue], others)
    # Running jobs that a waiting job may stop: each joins its type's pool at its stop_from (`due`, a heap), and
    # leaves it when it ends (its release, at its end, is among the others) or is stopped (the release taken out).
    victims: list[_Victim] = [(r, rank[r.requeue.order], release, r.requeue.order)
                              for r, release in stoppable if r.requeue]
    due = [(r.stop_from or now, n) for n, (r, _, _, _) in enumerate(victims)]
    heapq.heapify(due)
    pool: dict[str, list[int]] = {}
    stopped: set[int] = set()
    # What a search for victims that found none saw, per type: (free GPUs, victims that had joined a pool, new
    # first jobs that may come before, the room of the teams with victims there). Until more GPUs are free, a
    # victim joins, a job is queued or let go by its user's cap, a job that may borrow starts, or one of those teams
    # has more room, the search
    # would find none again: it is skipped. (Any other start leaves a first job of its bucket's team that asks as
    # much and comes later; the bucket of jobs that may borrow holds every team's, so its next may be another's.)
    searched: dict[str, tuple[int, int, int, dict[str, int]]] = {}
    joined = new_firsts = 0
    # Buckets by number: the jobs (in a heap by order), (gpu type, GPUs), current token.
    numbers: dict[_BucketKey, int] = {}
    # (each bucket sorted by (-rank, -sequence): its first job last)
    buckets: list[list[tuple[int, int, Waiting]]] = []
    kinds: list[tuple[str, int]] = []
    token: list[int] = []
    tokens = itertools.count()
    queued = 0  # jobs in buckets
    # gpu type -> GPUs -> offers of the buckets not held back by quota or cap; and the same as (GPUs, offers)
    # in ascending GPUs
    offers: dict[str, dict[int, list[_Offer]]] = {t: {} for t in capacity_by_type}
    by_size: dict[str, list[tuple[int, list[_Offer]]]] = {t: [] for t in capacity_by_type}
    # gpu type -> the offers whose first comes first among those its free GPUs fit, and that first's rank;
    # `changed`: the types whose free GPUs or offers changed since
    # ((inf, None) for a type that fits none)
    best_of: dict[str, tuple[float, list[_Offer] | None]] = {}
    changed: set[str] = set(capacity_by_type)
    short_of_team: dict[str, list[_Parked]] = {}
    short_of_user: dict[tuple[str, str], list[_Parked]] = {}

    def held_back(job: Waiting) -> bool:
        """By its team's quota or its user's cap."""
        if job.quota_bound and team_room[job.team] < job.units:
            return True
        if not user_room:  # (no caps: the common case, without making a key)
            return False
        room = user_room.get((job.team, job.user))
        return room is not None and room < job.units

    def review(b: int) -> None:
        """Park bucket `b` on the quota or cap that holds its first job back, or offer it by its GPUs."""
        bucket = buckets[b]
        t = token[b] = next(tokens)  # (a new token: the bucket's older offers and parkings no longer count)
        changed.add(kinds[b][0])
        if not bucket:
            return
        negative_rank, _, job = bucket[-1]
        if job.quota_bound and team_room[job.team] < job.units:
            heappush(short_of_team.setdefault(job.team, []), (job.units, t, b))
        elif user_room and (room := user_room.get((job.team, job.user))) is not None and room < job.units:
            heappush(short_of_user.setdefault((job.team, job.user), []), (job.units, t, b))
        else:
            gpu_type, gpus = kinds[b]
            heap = offers[gpu_type].get(gpus)
            if heap is None:
                heap = offers[gpu_type][gpus] = []
                by_size[gpu_type] = sorted(offers[gpu_type].items(), key=lambda item: item[0])
            heappush(heap, (-negative_rank, t, b))

    def wake(parked: list[_Parked], room: int) -> None:
        """Review the buckets parked for at most `room` units."""
        while parked and parked[0][0] <= room:
            _, t, b = heappop(parked)
            if token[b] == t:
                review(b)

    def withdraw_offer(b: int) -> None:
        """Take bucket `b`'s offer (if it has one) out of its heap, so that the heaps hold only current offers and
        the search for the first fitting offer need not check tokens (rare: only a submission or a stopped job
        becoming a first job)."""
        gpu_type, gpus = kinds[b]
        heap = offers[gpu_type].get(gpus)
        if heap:
            kept = [offer for offer in heap if offer[2] != b]
            if len(kept) < len(heap):
                heap[:] = kept
                heapq.heapify(heap)

    def bucket_of(job: Waiting) -> int | None:
        """The number of the job's bucket (made if new), or None for a job that no type here can ever fit."""
        gpu_type = job.gpu_type or default_type
        if gpu_type is None or gpu_type not in capacity_by_type or job.gpus > capacity_by_type[gpu_type]:
            if not job.expected:
                estimates.setdefault(job.job_id, None)
                unplaced.discard(job.job_id)
            return None
        team_room.setdefault(job.team, 0)
        capped = bool(user_room) and (job.team, job.user) in user_room  # (no key made when no user has a cap)
        key = (
            gpu_type,
            job.gpus,
            job.team if job.quota_bound or capped else "",
            job.user if capped else "",
            job.quota_bound,
        )
        b = numbers.get(key)
        if b is None:
            b = numbers[key] = len(buckets)
            buckets.append([])
            kinds.append((gpu_type, job.gpus))
            token.append(-1)
        return b

    def enqueue(job: Waiting) -> None:
        nonlocal queued, new_firsts
        new_firsts += 1
        b = bucket_of(job)
        if b is None:
            return
        bucket = buckets[b]
        insort(bucket, (-rank[job.order], -next(seq), job))
        queued += 1
        if bucket[-1][2] is job:  # a new first job
            withdraw_offer(b)
            review(b)

    def start(job: Waiting, at: float, confidence: float) -> None:
        gpu_type = job.gpu_type or default_type or ""
        free[gpu_type] -= job.gpus
        changed.add(gpu_type)
        team_room[job.team] = team_room.get(job.team, 0) - job.units
        if user_room and (job.team, job.user) in user_room:
            user_room[(job.team, job.user)] -= job.units
        # A job stopped and waiting again keeps the estimate of its first wait.
        if not job.expected and job.job_id not in estimates:
            estimates[job.job_id] = (at, confidence)
            unplaced.discard(job.job_id)
        release_at(at + job.runtime_s, (gpu_type, job.gpus, job.team, job.user, job.units,
                                        min(confidence, job.confidence), None))

    def preempt(clock: float) -> bool:
        """Stop running jobs of the pools for the first waiting job (in queue order) that they then let start, as
        the pass's victim search would: jobs of its team ranked after it, the last ranked first, only as many as
        it needs (GPUs, and its team's quota when that holds it back). True when some were stopped (they wait
        again, for what is left of their run)."""
        for gpu_type, members in list(pool.items()):
            seen = searched.get(gpu_type)
            if (seen is not None and free[gpu_type] <= seen[0] and (joined, new_firsts) == seen[1:3]
                    and all(team_room[team] <= room for team, room in seen[3].items())):
                continue
            members[:] = [n for n in members if n not in stopped and victims[n][0].at > clock]
            if not members:
                del pool[gpu_type]  # (until a victim joins it again: no search while no pool has any)
                continue
            # per team with victims here: their GPUs, units and latest rank (a job ranked after it stops none), and
            # the victims, the last ranked first (the order they are stopped in)
            by_team: dict[str, list[int]] = {}
            team_victims: dict[str, list[int]] = {}
            for n in members:
                r, victim_rank = victims[n][0], victims[n][1]
                totals = by_team.get(r.team)
                if totals is None:
                    by_team[r.team] = [r.gpus, r.units, victim_rank]
                    team_victims[r.team] = [n]
                else:
                    totals[0] += r.gpus
                    totals[1] += r.units
                    if victim_rank > totals[2]:
                        totals[2] = victim_rank
                    team_victims[r.team].append(n)
            for listed in team_victims.values():
                listed.sort(key=lambda n: -victims[n][1])
            room = free[gpu_type]
            # the first jobs of the buckets of those teams offered for this type, and of those parked on their
            # team's quota that its victims' units would let start, each if all its team's victims could make room
            firsts = []
            for _, heap in by_size[gpu_type]:
                for first_rank, _, b in heap:
                    job = buckets[b][-1][2]
                    team_has = by_team.get(job.team)
                    if team_has is not None and first_rank < team_has[2] and room + team_has[0] >= job.gpus:
                        firsts.append((first_rank, b))
            for team, (gpus, units, last_rank) in by_team.items():
                for _, t, b in _at_most(short_of_team.get(team, []), team_room[team] + units):
                    negative_rank, _, job = buckets[b][-1]
                    if (token[b] == t and kinds[b][0] == gpu_type and -negative_rank < last_rank
                            and room + gpus >= job.gpus):
                        firsts.append((-negative_rank, b))
            for first_rank, b in sorted(firsts):
                job = buckets[b][-1][2]
                gpus, units = room, team_room[job.team] if job.quota_bound else job.units
                chosen = []
                for n in team_victims[job.team]:
                    if gpus >= job.gpus and units >= job.units or victims[n][1] <= first_rank:
                        break
                    requeue = victims[n][0].requeue
                    if may_stop is None or requeue is None or may_stop(job, requeue):
                        chosen.append(n)
                        gpus += victims[n][0].gpus
                        units += victims[n][0].units
                if chosen and gpus >= job.gpus and units >= job.units:
                    for n in chosen:
                        stop(n, clock)
                    return True
            searched[gpu_type] = (free[gpu_type], joined, new_firsts, {team: team_room[team] for team in by_team})
        return False

    def time_sliced(job: Waiting, clock: float, end: float, release: _Freed) -> None:
        """A job started at `clock` that may be stopped once it has moved on (Waiting.slice_s): a victim from then
        on, waiting again with its moved-on order (and no further slice) when stopped."""
        assert job.slice_s is not None and job.moved_order is not None
        moved = replace(job, order=job.moved_order, slice_s=None, moved_order=None)
        r = Release(end, release[0], job.gpus, job.team, job.user, job.units, release[5], moved, clock + job.slice_s)
        heappush(due, (clock + job.slice_s, len(victims)))
        victims.append((r, rank[job.moved_order], release, job.moved_order))

    def stop(n: int, clock: float) -> None:
        r, _, release, _ = victims[n]
        stopped.add(n)
        freed_by[r.at].remove(release)
        gpu_type = release[0] or ""
        free[gpu_type] += r.gpus
        changed.add(gpu_type)
        team_room[r.team] = room = team_room[r.team] + r.units
        if (parked := short_of_team.get(r.team)) and parked[0][0] <= room:
            wake(parked, room)
        if user_room and (r.team, r.user) in user_room:
            user_room[(r.team, r.user)] = room = user_room[(r.team, r.user)] + r.units
            if (parked := short_of_user.get((r.team, r.user))) and parked[0][0] <= room:
                wake(parked, room)
        assert r.requeue is not None  # (a victim has its entry waiting again)
        enqueue(replace(r.requeue, runtime_s=r.at - clock))

    reserved = 0  # reserved starts still to come
    # queued jobs still without an estimate: the replay stops when none is left
    unplaced = {job.job_id for job in queue}
    # (gpu type, GPUs, team, user, whether bound by quota) as the job says them -> its bucket: bucket_of once per
    # demand rather than per job
    known: dict[tuple[str | None, int, str, str, bool], int] = {}
    for job, queue_rank in zip(queue, queue_ranks, strict=True):
        if job.fixed_start is None:
            demand = (job.gpu_type, job.gpus, job.team, job.user, job.quota_bound)
            b = known.get(demand)
            if b is None and (b := bucket_of(job)) is not None:
                known[demand] = b
            if b is not None:
                buckets[b].append((-queue_rank, -next(seq), job))
                queued += 1
        elif (job.gpu_type or default_type) in free:
            heapq.heappush(events, (max(now, job.fixed_start), next(seq), job, None))
            reserved += 1
            team_room.setdefault(job.team, 0)
        else:
            estimates[job.job_id] = None
            unplaced.discard(job.job_id)
    for b, bucket in enumerate(buckets):
        bucket.sort()  # (the queue comes in order: one reversal)
        review(b)
    clock = now
    while True:
        while events and events[0][0] <= clock:
            _, _, reserved_start, arrival = heappop(events)
            if arrival is not None:
                enqueue(arrival)
            elif reserved_start is not None:
                start(reserved_start, clock, reserved_start.fixed_confidence)
                reserved -= 1
        moment_confidence = 1.0
        while freed and freed[0] <= clock:
            for gpu_type, gpus, team, user, units, confidence, requeue in freed_by.pop(heappop(freed)):
                if confidence < moment_confidence:  # (min(), written out: ten thousand releases)
                    moment_confidence = confidence
                if gpu_type in free:
                    free[gpu_type] += gpus
                    changed.add(gpu_type)
                team_room[team] = room = team_room[team] + units
                if (parked := short_of_team.get(team)) and parked[0][0] <= room:
                    wake(parked, room)
                if user_room and (team, user) in user_room:
                    user_room[(team, user)] = room = user_room[(team, user)] + units
                    if (parked := short_of_user.get((team, user))) and parked[0][0] <= room:
                        wake(parked, room)
                        new_firsts += 1  # (a job held back by its user's cap: no victim search counted it)
                if requeue is not None:
                    enqueue(requeue)
        while due and due[0][0] <= clock:
            n = heappop(due)[1]
            if victims[n][0].at > clock:
                pool.setdefault(victims[n][2][0] or "", []).append(n)
                joined += 1
        while True:
            # The offers whose first comes first among those the free GPUs fit (every offer in a heap is current:
            # enqueue withdraws the one it replaces). Looked for twice a moment or more, ten thousand moments a pass.
            for gpu_type in changed:
                room = free[gpu_type]
                best: list[_Offer] | None = None
                best_rank = INFINITY
                for gpus, heap in by_size[gpu_type]:
                    if gpus > room:
                        break
                    if heap and heap[0][0] < best_rank:
                        best, best_rank = heap, heap[0][0]
                best_of[gpu_type] = (best_rank, best)
            changed.clear()
            first: list[_Offer] | None = None
            first_rank = INFINITY
            for rank_, heap_ in best_of.values():
                if rank_ < first_rank:
                    first_rank, first = rank_, heap_
            if first is None:
                if pool and preempt(clock):
                    continue
                break
            heap = first
            b = heap[0][2]
            bucket = buckets[b]
            job = bucket[-1][2]
            # held_back(job), its quota test written out (the common case): starts since it was offered took the room
            if job.quota_bound and team_room[job.team] < job.units or user_room and held_back(job):
                heappop(heap)
                review(b)
                continue
            bucket.pop()
            queued -= 1
            if not job.quota_bound:
                new_firsts += 1
            # start(job, clock, moment_confidence), written out: ten thousand starts a pass
            gpu_type, gpus = kinds[b]
            free[gpu_type] -= gpus
            changed.add(gpu_type)
            team, units = job.team, job.units
            team_room[team] -= units
            if user_room and (team, job.user) in user_room:
                user_room[(team, job.user)] -= units
            job_id = job.job_id
            if not job.expected and job_id not in estimates:
                estimates[job_id] = (clock, moment_confidence)
                unplaced.discard(job_id)
            # (release_at, written out)
            release = (gpu_type, gpus, team, job.user, units,
                       job.confidence if job.confidence < moment_confidence else moment_confidence, None)
            if (moment := freed_by.get(at := clock + job.runtime_s)) is None:
                freed_by[at] = [release]
                heappush(freed, at)
            else:
                moment.append(release)
            if job.slice_s is not None and job.slice_s < job.runtime_s and job.moved_order in rank:
                time_sliced(job, clock, at, release)
            # the bucket's next job, offered in its place unless held back
            if bucket and not (
                (nxt := bucket[-1][2]).quota_bound and team_room[nxt.team] < nxt.units
                or user_room and held_back(nxt)
            ):
                t = token[b] = next(tokens)
                heapreplace(heap, (-bucket[-1][0], t, b))
            else:
                heappop(heap)
                review(b)
        if not unplaced or not (reserved or queued) or not (events or freed or due):
            break
        # (the earliest of the next release, event and victim due, written out: ten thousand moments a pass)
        next_at = freed[0] if freed else INFINITY
        if events and events[0][0] < next_at:
            next_at = events[0][0]
        if due and due[0][0] < next_at:
            next_at = due[0][0]
        if next_at > clock:
            clock = next_at
    for job_id in unplaced:
        estimates.setdefault(job_id, None)
    return estimates


def _at_most(heap: list[_Parked], units: int) -> Iterable[_Parked]:
    """The entries of a heap of parked buckets that need at most `units` (a walk that skips every subtree whose
    root needs more: all below it do)."""
    stack = [0] if heap else []
    while stack:
        i = stack.pop()
        if heap[i][0] <= units:
            yield heap[i]
            stack.extend(child for child in (2 * i + 1, 2 * i + 2) if child < len(heap))


def _ranks(orders: list[Order], others: list[Order]) -> tuple[list[int], dict[Order, int]]:
    """Each order's place among `orders` and `others` together, equal orders all at the last one's place: those of
    `orders` as a list beside them, and those of `others` by order (the caller looks up only those).

    `orders` is the pass's queue, nearly always strictly increasing: then none of its orders is hashed or sorted.
    The place of its i-th order is i plus the others at or before it; an other's is the orders and others at or
    before it, less one."""
    if not all(map(lt, orders, itertools.islice(orders, 1, None))):
        rank = {order: i for i, order in enumerate(sorted(orders + others))}
        return [rank[order] for order in orders], rank
    ahead = sorted(others)
    # (the others at or before orders[i]: a running count of where each falls)
    falls = [0] * (len(orders) + 1)
    for order in ahead:
        falls[bisect_left(orders, order)] += 1
    places = list(map(add, range(len(orders)), itertools.accumulate(falls)))
    return places, {order: bisect_right(orders, order) + bisect_right(ahead, order) - 1 for order in ahead}


# Submissions closer than this to each other (and the last one this close to now) make one burst, and a burst of
# at least MIN_BURST jobs is a sweep going on (a few jobs minutes apart say little of what comes next).
BURST_GAP_S = 120.0
MIN_BURST = 10
# At most this many expected submissions (the latest of a longer burst).
MAX_EXPECTED = 2_000
# How sure an expected submission is (the Lindy rule: as likely to come as not): a start after its end is no surer.
EXPECTED_CONFIDENCE = 0.5


def expected_arrivals(now: float, recent: Iterable[Waiting]) -> list[tuple[float, Waiting]]:
    """The submissions expected after now, for estimate_starts: the burst going on now continues as long again.

    Jobs come in bursts (a sweep of hundreds of jobs in minutes, then hours of quiet); a job estimated as it is
    submitted waits for the rest of its burst that goes ahead of it in the queue, which nobody knows yet. With no
    better knowledge, a burst that has lasted D is as likely to be half over as not (the Lindy rule): its
    submissions so far are expected again, D later, each with its order as submitted: its score now with the aging
    (ordering.aging_boost over its Waiting.aging_s) it has had undone, so that a like job submitted later comes
    behind the like jobs waiting now, as aging ranks it (with their scores now, the copies of a sweep's first jobs went
    ahead of its later ones: trace4 without declarations 0.92 -> 0.74 of the wait). `recent`: the jobs submitted
    lately, waiting or started, their order's third field the time they were submitted. No sweep going on (fewer than MIN_BURST submissions each within
    BURST_GAP_S of the next, the last within BURST_GAP_S of now): none expected.
    """
    jobs = sorted(recent, key=lambda job: job.order[2], reverse=True)
    burst: list[Waiting] = []
    last = now
    for job in jobs:
        submitted = job.order[2]
        if submitted > now:
            continue
        if last - submitted > BURST_GAP_S or len(burst) >= MAX_EXPECTED:
            break
        burst.append(job)
        last = submitted
    if len(burst) < MIN_BURST or now <= last:  # (one instant's submissions: a batch, no sign of more)
        return []
    lasted = now - last + (now - last) / len(burst)
    expected = []
    for job in burst:
        at = job.order[2] + lasted
        priority, score, submitted, job_id = job.order
        score *= aging_boost(submitted, now, job.aging_s)
        confidence = min(job.confidence, EXPECTED_CONFIDENCE)
        expected.append(
            (at, replace(job, order=(priority, score, at, -1 - job_id), fixed_start=None, confidence=confidence,
                         slice_s=None, moved_order=None))
        )
    return expected
