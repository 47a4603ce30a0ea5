"""Event-driven simulation of a trace on a cluster, calling a policy at every arrival, completion and wake-up.

Simulated time jumps from event to event; a pass sees a Snapshot built incrementally (waiting jobs are cached
and rebuilt only when they change). A job that restarts after a preemption first spends `preempt_cost_s` making
no progress (checkpoint reload), then runs its remaining time; a job's GPU-seconds count as busy from start.

A job placed with a share of a GPU (Placement.gpu_share < 1) shares it with the other fractions there and runs
slower by the interference model (interference.py); whenever a job joins or leaves a shared GPU the others on it
are brought up to date and their ends re-timed. A fraction's GPU-seconds count its share (usage.py, the
formula the console counts by); fair-share usage decays as the console's does, charged up to each event before
it changes the running jobs.

Packing (`join`, called through the optional `pack` hook after each pass): a waiting job of N GPUs joins a running
job of N GPUs on exactly its GPU set, forming a group of at most PACK_LIMIT jobs interleaved on those GPUs. Every
member runs slower by the interference model's slowdown for the whole group (interference.py, joint rounds, with
the simulator's `switch_overhead`), re-timed whenever a member joins or leaves; the GPUs' busy time is split
evenly between the members while they share. Each GPU thus holds at most PACK_LIMIT jobs (a placement never lands
on a GPU a group holds: its units count FULL per member).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from apps.scheduling.config import PolicyConfig
from apps.scheduling.interference import profile, slowdowns
from apps.scheduling.placeability import candidates, gpu_index, placement_refusal, units_in_use
from apps.scheduling.prediction import OVERRUN_FRACTION, FinishedRun, RuntimeHistory
from apps.scheduling.sharing import FULL, share_units
from apps.scheduling.similarity import similarity_key
from apps.scheduling.trace import TraceJob
from apps.scheduling.types import Decisions, HostView, PendingJob, RunningJob, Snapshot, TeamQuotaView
from apps.scheduling.usage import decay, decayed_gpu_seconds, segment_gpu_seconds

# Jobs interleaved at most on one GPU set by `join`.
PACK_LIMIT = 4
# At most this many passes at one instant (a pass that preempted asks for another to fill the freed GPUs).
PASSES_PER_INSTANT = 3
EPSILON_S = 1e-6
# The shortest beat (Simulator's pass_interval_s): shorter ones would not move the clock on.
MIN_PASS_INTERVAL_S = 1.0


def beat(seconds: float | None) -> float | None:
    """A pass interval as the simulator takes it: None for no beat, else at least MIN_PASS_INTERVAL_S and finite
    (ValueError otherwise: shorter ones never move the clock on; the command lines' 0 is None)."""
    if seconds is None:
        return None
    if not MIN_PASS_INTERVAL_S <= seconds < float("inf"):
        raise ValueError(f"pass_interval_s: expected None (no beat) or at least {MIN_PASS_INTERVAL_S:g} s, not {seconds}")
    return seconds


class Policy(Protocol):
    """What the simulator calls: the core's `schedule` with a config, or a baseline with `decide`."""

    def decide(self, snapshot: Snapshot) -> Decisions: ...


@dataclass
class JobState:
    trace: TraceJob
    remaining_s: float
    attained_gpu_s: float = 0.0
    preemptions: int = 0
    first_start: float | None = None
    finish: float | None = None
    # The policy's estimated start for the job when it was submitted (the last pass at that instant), and
    # whether it was still waiting after that pass (a job placed at once has no wait to estimate).
    estimate_at_submit: float | None = None
    waited_at_submit: bool = False
    run_start: float = 0.0
    # Time of the current run spent reloading before progress resumes.
    run_overhead_s: float = 0.0
    end_token: int = 0
    # Sharing a GPU: the share of the current run, progress per second (1 / slowdown), and when `remaining_s`
    # was last brought up to date.
    share: float = 1.0
    rate: float = 1.0
    settled_at: float = 0.0
    # Packed with others on its GPU set (the group's key, its sorted GPU ids) during the current run; `segmented`
    # once it has been, for the rest of the run: progress then goes by `rate`, and the GPU-seconds of the run
    # are charged in segments (`run_gpu_s` up to `charged_at`, split between the members).
    group: tuple[int, ...] | None = None
    segmented: bool = False
    run_gpu_s: float = 0.0
    charged_at: float = 0.0

    @property
    def share_units(self) -> int:
        """Units of each GPU the current run holds (FULL for whole GPUs)."""
        return share_units(self.share) if self.share < 1.0 else FULL

    def gpu_seconds(self, seconds: float) -> float:
        return segment_gpu_seconds(self.trace.gpus, self.share_units, seconds)


@dataclass
class TeamUsage:
    """Decayed GPU-second usage, updated at each pass (as Slurm's fair-share decays its usage)."""

    half_life_s: float
    value: float = 0.0
    users: dict[str, float] = field(default_factory=dict)


@dataclass
class SimResult:
    policy: str
    jobs: list[JobState]
    gpus: int
    busy_gpu_s: float
    preemptions: int
    migrations: int
    passes: int
    teams: dict[str, TeamQuotaView]


class Simulator:
    def __init__(
        self,
        jobs: list[TraceJob],
        hosts: tuple[HostView, ...],
        decide: Callable[[Snapshot], Decisions],
        quotas: dict[str, TeamQuotaView],
        preempt_cost_s: float = 0.0,
        config: PolicyConfig | None = None,
        console_view: bool = True,
        switch_overhead: float = 0.0,
        pack: Callable[[Snapshot, Decisions], Sequence[tuple[int, tuple[int, ...]]]] | None = None,
        pass_interval_s: float | None = None,
    ) -> None:
        self.jobs = {job.job_id: JobState(job, job.duration_s) for job in jobs}
        self.keys = {job.job_id: similarity_key(job.workload) for job in jobs}
        self.arrivals = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.hosts = hosts
        self.gpu_index = gpu_index(hosts)
        self.gpus = sum(len(h.gpus) for h in hosts)
        self.decide = decide
        self.base_quotas = quotas
        self.preempt_cost_s = preempt_cost_s
        # Also a pass at least this often while jobs wait and others run, as the console's beat runs one every few
        # seconds (CONSOLE_SCHEDULER_INTERVAL_S). None: only at arrivals, ends and the pass's wake_at, which misses
        # a running job whose score grows past the preemption bar between them (trace3 without declarations:
        # 86.6 h; a pass every 300 s too: 82.9 h).
        self.pass_interval_s = beat(pass_interval_s)
        self.half_life_s = (config or PolicyConfig()).usage_half_life_s
        # What the console would know: declared steps, and step time once a job has run.
        self.console_view = console_view
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, RunningJob] = {}
        self.history = RuntimeHistory()
        self.ends: list[tuple[float, int, int]] = []
        self.usage = {team: TeamUsage(self.half_life_s) for team in quotas}
        self.usage_clock = 0.0
        self.busy_gpu_s = 0.0
        self.preemption_count = 0
        self.migration_count = 0
        self.passes = 0
        self.switch_overhead = switch_overhead
        # gpu id -> jobs running on it with a share
        self.sharing: dict[int, list[int]] = {}
        # Packing: after each pass, (waiting job, GPU set of a running job) to join (see `join`).
        self.pack = pack
        # sorted GPU ids -> the jobs packed on them
        self.groups: dict[tuple[int, ...], list[int]] = {}

    # -- oracle access for baseline policies ---------------------------------------------------------------
    def true_remaining(self, job_id: int) -> tuple[float, float]:
        state = self.jobs[job_id]
        if job_id in self.running and (state.share < 1.0 or state.segmented):
            begin = max(state.settled_at, state.run_start + state.run_overhead_s)
            progress = max(0.0, self.now - begin) * state.rate
            return max(0.0, state.remaining_s - progress), state.trace.duration_s
        if job_id in self.running:
            progress = max(0.0, self.now - state.run_start - state.run_overhead_s)
            return max(0.0, state.remaining_s - progress), state.trace.duration_s
        return state.remaining_s, state.trace.duration_s

    def declared_remaining(self, job_id: int) -> tuple[float, float]:
        """(remaining seconds as the job's declaration says, its declared run time) for the srsf-declared
        baseline: its declared steps at its true step time (what a running job reports) less what it has run; past
        them a quarter of its run (prediction.OVERRUN_FRACTION). A job that declares nothing is worth what it has
        run (least attained service first, as 2D-LAS without queues)."""
        remaining, total = self.true_remaining(job_id)
        trace = self.jobs[job_id].trace
        done = total - remaining
        declared = trace.declared_steps
        if declared is None or not trace.iterations:
            return done, done
        declared_total = declared * total / trace.iterations
        left = declared_total - done
        return (left if left > 0 else OVERRUN_FRACTION * done), declared_total

    def waiting_view(self, job_id: int) -> PendingJob:
        """The job as a waiting one, as of its last settled progress (for a policy offering a packed job elsewhere)."""
        return self._pending_view(self.jobs[job_id])

    # -- snapshot ---------------------------------------------------------------------------------------------
    def _pending_view(self, state: JobState) -> PendingJob:
        trace = state.trace
        started = state.first_start is not None
        steps_done = 0
        if trace.iterations and trace.duration_s > 0:
            steps_done = int(trace.iterations * (1.0 - state.remaining_s / trace.duration_s))
        return PendingJob(
            job_id=trace.job_id,
            team=trace.team,
            user=trace.user,
            gpus=trace.gpus,
            priority=trace.priority,
            submitted_at=trace.submit_s,
            attained_gpu_seconds=state.attained_gpu_s,
            declared_steps=trace.declared_steps if self.console_view else None,
            steps_done=steps_done,
            observed_step_s=trace.step_s if started and self.console_view else None,
            preemption_count=state.preemptions,
            similarity_key=self.keys[trace.job_id],
        )

    def _running_view(self, state: JobState, gpu_ids: tuple[int, ...], borrowing: bool) -> RunningJob:
        view = self._pending_view(state)
        step = state.trace.step_s if self.console_view else None
        reported_at = state.run_start + state.run_overhead_s
        if state.share < 1.0 or state.segmented:
            # What the console would see of a shared job: its slowed step time, steps as of the last change.
            step = state.trace.step_s / state.rate if state.trace.step_s and self.console_view else None
            reported_at = max(state.settled_at, reported_at)
        return RunningJob(
            job_id=view.job_id,
            team=view.team,
            user=view.user,
            gpus=view.gpus,
            priority=view.priority,
            gpu_ids=gpu_ids,
            started_at=state.run_start,
            submitted_at=view.submitted_at,
            attained_gpu_seconds=state.attained_gpu_s,
            declared_steps=view.declared_steps,
            steps_done=view.steps_done,
            observed_step_s=step,
            preemption_count=state.preemptions,
            borrowing=borrowing,
            similarity_key=view.similarity_key,
            steps_reported_at=reported_at,
            gpu_share=min(state.share, 1.0),
        )

    def _charge_usage(self) -> None:
        """Bring fair-share usage up to now: decay what was recorded, add the running jobs' decayed GPU-seconds
        since the last charge. Called whenever time moves, before a job ends, so a run's last stretch counts."""
        if len(self.base_quotas) <= 1 or self.now <= self.usage_clock:
            return
        factor = decay(self.now - self.usage_clock, self.half_life_s)
        for usage in self.usage.values():
            usage.value *= factor
            for user in usage.users:
                usage.users[user] *= factor
        for job in self.running.values():
            team = self.usage.get(job.team)
            if team is None:
                continue
            state = self.jobs[job.job_id]
            charged = decayed_gpu_seconds(
                job.gpus,
                state.share_units,
                max(state.run_start, self.usage_clock),
                self.now,
                self.now,
                self.half_life_s,
            )
            team.value += charged
            team.users[job.user] = team.users.get(job.user, 0.0) + charged
        self.usage_clock = self.now

    def _quotas(self) -> dict[str, TeamQuotaView]:
        if len(self.base_quotas) <= 1:
            return self.base_quotas
        self._charge_usage()
        return {
            team: TeamQuotaView(
                team,
                quota.max_gpus,
                quota.user_max_gpus,
                quota.share,
                self.usage[team].value,
                quota.may_borrow,
                quota.user_shares,
                dict(self.usage[team].users),
            )
            for team, quota in self.base_quotas.items()
        }

    # -- events -----------------------------------------------------------------------------------------------
    def _finish(self, job_id: int) -> None:
        state = self.jobs[job_id]
        if state.segmented:
            self._leave_group(job_id)
        running = self.running.pop(job_id)
        ran = state.run_gpu_s if state.segmented else state.gpu_seconds(self.now - state.run_start)
        state.group, state.segmented = None, False
        self.busy_gpu_s += ran
        state.attained_gpu_s += ran
        state.remaining_s = 0.0
        if state.share < 1.0:
            self._leave_shared(job_id, running.gpu_ids)
        state.finish = self.now
        trace = state.trace
        self.history.record(
            trace.user,
            self.keys[job_id],
            FinishedRun(
                trace.gpus,
                trace.duration_s,
                trace.step_s,
                declared_steps=trace.declared_steps if self.console_view else None,
                steps=trace.iterations,
            ),
        )

    def _stop(self, job_id: int, counts: bool = True) -> None:
        """Stop a running job; it waits again. `counts`: a preemption of the job (not a move, Preemption.moved)."""
        state = self.jobs[job_id]
        if state.segmented:
            self._leave_group(job_id)  # settles it: remaining time and GPU-seconds up to now
            self.running.pop(job_id)
            self.busy_gpu_s += state.run_gpu_s
            state.attained_gpu_s += state.run_gpu_s
            state.group, state.segmented = None, False
        else:
            running = self.running.pop(job_id)
            ran = self.now - state.run_start
            self.busy_gpu_s += state.gpu_seconds(ran)
            state.attained_gpu_s += state.gpu_seconds(ran)
            if state.share < 1.0:
                self._settle(state)
                self._leave_shared(job_id, running.gpu_ids)
            else:
                state.remaining_s = max(0.0, state.remaining_s - max(0.0, ran - state.run_overhead_s))
        if counts:
            state.preemptions += 1
        state.end_token += 1
        self.pending[job_id] = self._pending_view(state)

    def _start(self, job_id: int, gpu_ids: tuple[int, ...], borrowing: bool, share: float = 1.0) -> None:
        state = self.jobs[job_id]
        del self.pending[job_id]
        if state.first_start is None:
            state.first_start = self.now
        state.run_start = self.now
        state.run_overhead_s = self.preempt_cost_s if state.preemptions else 0.0
        state.end_token += 1
        state.share, state.rate, state.settled_at = share, 1.0, self.now
        state.group, state.segmented, state.run_gpu_s, state.charged_at = None, False, 0.0, self.now
        self.running[job_id] = self._running_view(state, gpu_ids, borrowing)
        if share < 1.0:
            for gpu_id in gpu_ids:
                self.sharing.setdefault(gpu_id, []).append(job_id)
                self._retime(gpu_id)
            return
        end = self.now + state.run_overhead_s + state.remaining_s
        heapq.heappush(self.ends, (end, job_id, state.end_token))

    # -- sharing ---------------------------------------------------------------------------------------------
    def _settle(self, state: JobState) -> None:
        """Bring a shared job's remaining time up to now at its current rate (and a packed job's GPU-seconds)."""
        if state.segmented and self.now > state.charged_at:
            members = len(self.groups.get(state.group, ())) if state.group is not None else 1
            state.run_gpu_s += state.trace.gpus * (self.now - state.charged_at) / max(1, members)
            state.charged_at = self.now
        begin = max(state.settled_at, state.run_start + state.run_overhead_s)
        if self.now > begin:
            state.remaining_s = max(0.0, state.remaining_s - (self.now - begin) * state.rate)
            state.settled_at = self.now

    def _leave_shared(self, job_id: int, gpu_ids: tuple[int, ...]) -> None:
        for gpu_id in gpu_ids:
            jobs = self.sharing.get(gpu_id, [])
            if job_id in jobs:
                jobs.remove(job_id)
            self._retime(gpu_id)

    def _retime(self, gpu_id: int) -> None:
        """Jobs on a shared GPU changed: settle each, give it its new rate and end, and refresh its view."""
        job_ids = self.sharing.get(gpu_id, [])
        if not job_ids:
            self.sharing.pop(gpu_id, None)
            return
        self._retime_jobs(job_ids)

    def _retime_jobs(self, job_ids: list[int]) -> None:
        """Jobs sharing GPUs: settle each, give it the rate and end its slowdown there gives, refresh its view."""
        states = [self.jobs[j] for j in job_ids]
        factors = slowdowns(
            [profile(s.trace.step_s, s.trace.resource_s) for s in states], self.switch_overhead
        )
        for state, factor in zip(states, factors, strict=True):
            self._settle(state)
            state.rate = 1.0 / factor
            state.end_token += 1
            begin = max(self.now, state.run_start + state.run_overhead_s)
            heapq.heappush(
                self.ends, (begin + state.remaining_s * factor, state.trace.job_id, state.end_token)
            )
            view = self.running[state.trace.job_id]
            self.running[state.trace.job_id] = self._running_view(state, view.gpu_ids, view.borrowing)

    # -- packing ---------------------------------------------------------------------------------------------
    def join(self, job_id: int, gpu_ids: tuple[int, ...]) -> None:
        """Start waiting job `job_id` interleaved with the running job(s) that hold exactly `gpu_ids` (as many GPUs
        as it asks for, whole, with at most PACK_LIMIT - 1 jobs there already); every member is re-timed."""
        key = tuple(sorted(gpu_ids))
        job = self.pending.get(job_id)
        if job is None:
            raise RuntimeError(f"packing job {job_id}, which is not waiting")
        if job.gpus != len(key):
            raise RuntimeError(f"packing job {job_id} of {job.gpus} GPUs onto {len(key)} GPUs")
        members = self.groups.get(key)
        if members is None:
            hosts = [j for j, run in self.running.items() if tuple(sorted(run.gpu_ids)) == key]
            on_them = [j for j, run in self.running.items() if set(run.gpu_ids) & set(key)]
            if len(hosts) != 1 or len(on_them) != 1:
                raise RuntimeError(f"packing job {job_id}: GPUs {key} are not held by exactly one job")
            host = self.jobs[hosts[0]]
            if host.share < 1.0:
                raise RuntimeError(f"packing job {job_id}: GPUs {key} hold a fraction")
            # The host ran alone so far: bring it up to date and switch it to rate-based progress.
            host.remaining_s = max(
                0.0, host.remaining_s - max(0.0, self.now - host.run_start - host.run_overhead_s)
            )
            host.settled_at = max(self.now, host.run_start + host.run_overhead_s)
            host.segmented, host.group = True, key
            host.run_gpu_s, host.charged_at = host.trace.gpus * (self.now - host.run_start), self.now
            members = self.groups[key] = [host.trace.job_id]
        if len(members) >= PACK_LIMIT:
            raise RuntimeError(f"packing job {job_id}: GPUs {key} already hold {len(members)} jobs")
        for member in members:
            self._settle(self.jobs[member])
        borrowing = self.running[members[0]].borrowing
        self._start(job_id, key, borrowing)
        state = self.jobs[job_id]
        state.segmented, state.group = True, key
        state.settled_at = max(self.now, state.run_start + state.run_overhead_s)
        # _start pushed an end at full speed: superseded by the re-timing below.
        members.append(job_id)
        self._retime_group(key)

    def _leave_group(self, job_id: int) -> None:
        """A packed job stops or ends: settle every member with the group as it was, then re-time the rest."""
        key = self.jobs[job_id].group
        if key is None:
            self._settle(self.jobs[job_id])
            return
        members = self.groups[key]
        for member in members:
            self._settle(self.jobs[member])
        members.remove(job_id)
        if not members:
            del self.groups[key]
            return
        self._retime_group(key)

    def _retime_group(self, key: tuple[int, ...]) -> None:
        """A group changed: each member's rate is 1 / its slowdown in the group, from its true profile."""
        self._retime_jobs(list(self.groups[key]))

    def _pack(self, decisions: Decisions) -> None:
        if self.pack is None:
            return
        snapshot = Snapshot(
            now=self.now,
            hosts=self.hosts,
            pending=tuple(self.pending.values()),
            running=tuple(self.running.values()),
            quotas=self.base_quotas,
            history=self.history,
        )
        for job_id, gpu_ids in self.pack(snapshot, decisions):
            self.join(job_id, gpu_ids)

    def _apply(self, decisions: Decisions) -> None:
        stopped = set()
        for preemption in decisions.preemptions:
            if preemption.job_id in self.running:
                self._stop(preemption.job_id, counts=not preemption.moved)
                stopped.add(preemption.job_id)
        used = units_in_use(self.running.values())
        for placement in decisions.placements:
            if placement.job_id not in self.pending:
                raise RuntimeError(f"policy placed job {placement.job_id}, which is not waiting")
            share = min(1.0, placement.gpu_share)
            units = share_units(share) if share < 1.0 else FULL
            job = self.pending[placement.job_id]
            offered = candidates(placement.gpu_ids, self.gpu_index, used)
            refusal = (
                "an unknown GPU"
                if offered is None
                else placement_refusal(replace(job, gpu_share=share), offered, units)
            )
            if refusal is not None:
                raise RuntimeError(f"policy placed job {placement.job_id} where it cannot run: {refusal}")
            for gpu_id in placement.gpu_ids:
                used[gpu_id] = used.get(gpu_id, 0) + units
            if placement.job_id in stopped:
                self.migration_count += 1
                self.preemption_count -= 1
            self._start(placement.job_id, placement.gpu_ids, placement.borrowing, share)
        self.preemption_count += len(stopped)

    def _record_estimates(self, arrived: list[JobState], decisions: Decisions) -> None:
        """What a user submitting now would be told: each new job's estimated start after the pass."""
        for state in arrived:
            info = decisions.pending.get(state.trace.job_id)
            state.waited_at_submit = info is not None
            state.estimate_at_submit = info.estimated_start if info is not None else None

    def run(self, name: str) -> SimResult:
        self.now = 0.0
        next_arrival = 0
        wake_at: float | None = None
        while next_arrival < len(self.arrivals) or self.running or self.pending:
            while self.ends and self.ends[0][2] != self.jobs[self.ends[0][1]].end_token:
                heapq.heappop(self.ends)
            candidates = []
            if next_arrival < len(self.arrivals):
                candidates.append(self.arrivals[next_arrival].submit_s)
            if self.ends:
                candidates.append(self.ends[0][0])
            if wake_at is not None and wake_at > self.now + EPSILON_S:
                candidates.append(wake_at)
            if self.pass_interval_s and self.pending and self.running:
                candidates.append(self.now + self.pass_interval_s)
            if not candidates:
                raise RuntimeError(f"{name}: {len(self.pending)} jobs can never run on this cluster")
            self.now = max(self.now, min(candidates))
            self._charge_usage()
            while self.ends and self.ends[0][0] <= self.now + EPSILON_S:
                _, job_id, token = heapq.heappop(self.ends)
                if token == self.jobs[job_id].end_token and job_id in self.running:
                    self._finish(job_id)
            arrived: list[JobState] = []
            while next_arrival < len(self.arrivals) and self.arrivals[next_arrival].submit_s <= self.now:
                state = self.jobs[self.arrivals[next_arrival].job_id]
                self.pending[state.trace.job_id] = self._pending_view(state)
                arrived.append(state)
                next_arrival += 1
            wake_at = None
            for _ in range(PASSES_PER_INSTANT):
                snapshot = Snapshot(
                    now=self.now,
                    hosts=self.hosts,
                    pending=tuple(self.pending.values()),
                    running=tuple(self.running.values()),
                    quotas=self._quotas(),
                    history=self.history,
                )
                decisions = self.decide(snapshot)
                self.passes += 1
                self._record_estimates(arrived, decisions)
                self._apply(decisions)
                self._pack(decisions)
                wake_at = decisions.wake_at
                if wake_at is None or wake_at > self.now + EPSILON_S or not self.pending:
                    break
        return SimResult(
            name,
            list(self.jobs.values()),
            self.gpus,
            self.busy_gpu_s,
            self.preemption_count,
            self.migration_count,
            self.passes,
            self._quotas(),
        )
