"""The console side of a scheduler pass: database snapshot → pure policy → atomic placements and preemptions."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Prefetch, Q

from apps.cluster.models import GPU, Host
from apps.jobs import services
from apps.jobs.models import Job, JobAllocation, UsageSegment
from apps.jobs.preempting import send_preemptions
from apps.jobs.scheduling_rows import HOLDING_FIELDS, JOB_FIELDS, epoch, host_view, job_common
from apps.jobs.selectors import runtime_history, throttled_array_tasks
from apps.jobs.usage import gpu_seconds_by_team, month_start
from apps.quotas.models import TeamQuota, UserQuota
from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.types import PendingJob, RunningJob, Snapshot, TeamQuotaView
from apps.scheduling.usage import budget_spent, decayed_gpu_seconds, segment_gpu_seconds

logger = logging.getLogger(__name__)


def policy_config() -> PolicyConfig:
    return PolicyConfig(**settings.SCHEDULER)


def _recent_usage(now: float, half_life: float) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Decayed GPU-seconds of the last 4 half-lives by team and by user (a fraction counts its share)."""
    since = datetime.fromtimestamp(now - 4 * half_life, tz=UTC)
    teams: dict[str, float] = defaultdict(float)
    users: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = UsageSegment.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since)).values_list(
        "team__slug", "user__username", "gpus", "share_units", "started_at", "ended_at"
    )
    for team, user, gpus, units, started, ended in rows:
        start = max(started.timestamp(), since.timestamp())
        usage = decayed_gpu_seconds(gpus, units, start, epoch(ended) or now, now, half_life)
        teams[team] += usage
        users[team][user] += usage
    return teams, users


def _attained_before_current_run(now: float) -> dict[int, float]:
    """GPU-seconds of each active job's earlier runs (segments that ended; the open one is the current run)."""
    attained: dict[int, float] = defaultdict(float)
    closed = UsageSegment.objects.filter(ended_at__isnull=False, job__state__in=(*Job.HOLDING_STATES, Job.State.QUEUED))
    rows = closed.values_list("job_id", "gpus", "share_units", "started_at", "ended_at")
    for job_id, gpus, units, started, ended in rows:
        attained[job_id] += segment_gpu_seconds(gpus, units, (ended - started).total_seconds())
    return attained


def build_snapshot(now: float | None = None, config: PolicyConfig | None = None,
                   held: Collection[int] | None = None) -> Snapshot:
    """The cluster as the policy sees it. `held`: queued jobs it does not see (selectors.throttled_array_tasks,
    looked up here when not given)."""
    now = now if now is not None else time.time()
    config = config or policy_config()
    held = throttled_array_tasks() if held is None else held
    hosts = tuple(
        host_view(host, list(host.gpus.all()))
        for host in Host.objects.prefetch_related(Prefetch("gpus", queryset=GPU.objects.order_by("index")))
    )
    # A job already asked to stop is left out: its GPUs count as free, so the policy does not pick further
    # victims for the same need; placements on them wait (job_place re-checks) until the agent releases them.
    holding = list(Job.objects.filter(state__in=Job.HOLDING_STATES, preempt_requested_at__isnull=True)
                   .values(**JOB_FIELDS, **HOLDING_FIELDS))
    queued = Job.objects.filter(state=Job.State.QUEUED).exclude(pk__in=list(held)).values(**JOB_FIELDS)
    gpu_ids: dict[int, list[int]] = defaultdict(list)
    for job_id, gpu_id in JobAllocation.objects.filter(released_at__isnull=True).order_by("id").values_list(
            "job_id", "gpu_id"):
        gpu_ids[job_id].append(gpu_id)
    attained = _attained_before_current_run(now)

    def common(job: dict) -> dict:
        return job_common(job, attained.get(job["job_id"], 0.0), now)

    running = tuple(
        RunningJob(
            **common(job),
            gpu_ids=tuple(gpu_ids[job["job_id"]]),
            started_at=epoch(began or job["placed_at_"]) or now,
            started=began is not None,
            borrowing=job["borrowing_"],
            steps_reported_at=epoch(job["progress_at_"]),
        )
        for job in holding
        for began in [job["started_at_"]]
    )
    pending = tuple(PendingJob(**common(job)) for job in queued)
    user_caps: dict[str, dict[str, int]] = defaultdict(dict)
    for team_slug, username, cap in UserQuota.objects.values_list("team__slug", "user__username", "max_gpus"):
        user_caps[team_slug][username] = cap
    team_usage, user_usage = _recent_usage(now, config.usage_half_life_s)
    team_quotas = list(TeamQuota.objects.select_related("team"))
    when = datetime.fromtimestamp(now, tz=UTC)
    budgeted = [quota.team_id for quota in team_quotas if quota.gpu_hours_per_month > 0]
    month_usage = gpu_seconds_by_team(month_start(when), when, budgeted) if budgeted else {}
    quotas = {
        quota.team.slug: TeamQuotaView(
            team=quota.team.slug,
            max_gpus=quota.max_gpus,
            user_max_gpus=user_caps.get(quota.team.slug, {}),
            share=quota.share,
            recent_usage_gpu_seconds=team_usage.get(quota.team.slug, 0.0),
            may_borrow=quota.may_borrow,
            user_recent_usage_gpu_seconds=dict(user_usage.get(quota.team.slug, {})),
            budget_spent=budget_spent(month_usage.get(quota.team.slug, 0.0), float(quota.gpu_hours_per_month)),
            stop_when_spent=quota.when_budget_spent == TeamQuota.WhenBudgetSpent.STOP,
        )
        for quota in team_quotas
    }
    return Snapshot(now=now, hosts=hosts, pending=pending, running=running, quotas=quotas, history=runtime_history())


@dataclass(frozen=True)
class PassResult:
    pending: int
    placed: int
    skipped: int
    preempted: int
    seconds: float


def scheduler_pass() -> PassResult:
    started = time.perf_counter()
    config = policy_config()
    held = throttled_array_tasks()
    snapshot = build_snapshot(config=config, held=held)
    decisions = schedule(snapshot, config)
    preempted, dropped = send_preemptions(decisions, config, lambda: build_snapshot(config=config))
    placed = 0
    pending_info: dict[int, tuple[str, int | None, datetime | None, float | None]] = {
        job_id: (
            info.reason,
            info.position,
            datetime.fromtimestamp(info.estimated_start, tz=UTC) if info.estimated_start is not None else None,
            info.confidence if info.estimated_start is not None else None,
        )
        for job_id, info in decisions.pending.items()
    }
    pending_info.update((job_id, (reason, None, None, None)) for job_id, reason in held.items())
    for placement in decisions.placements:
        if placement.job_id in dropped:  # it starts on GPUs now free, in the next pass
            continue
        share_units = round(placement.gpu_share * 100)
        if services.job_place(placement.job_id, placement.gpu_ids, borrowing=placement.borrowing,
                              share_units=share_units):
            placed += 1
        else:
            pending_info[placement.job_id] = ("starting: waiting for its GPUs to be released", 1, None, None)
    services.jobs_set_pending_info(pending_info)
    if decisions.wake_at is not None or preempted or dropped:
        services.request_scheduler_pass()
    result = PassResult(
        pending=len(snapshot.pending),
        placed=placed,
        skipped=len(decisions.placements) - placed,
        preempted=preempted,
        seconds=time.perf_counter() - started,
    )
    if placed or preempted:
        logger.info("scheduler pass: %s", result)
    return result
