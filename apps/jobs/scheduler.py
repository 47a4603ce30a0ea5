"""The console side of a scheduler pass: database snapshot → pure policy → atomic placements and preemptions."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath

from django.conf import settings
from django.db.models import F, Prefetch, Q
from django.utils import timezone

from apps.cluster.models import GPU, Host
from apps.jobs import services
from apps.jobs.models import Job, JobAllocation, UsageSegment
from apps.quotas.models import TeamQuota, UserQuota
from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.prediction import FinishedRun, RuntimeHistory
from apps.scheduling.types import GpuView, HostView, PendingJob, Priority, RunningJob, Snapshot, TeamQuotaView

logger = logging.getLogger(__name__)
HISTORY_DAYS = 30
HISTORY_RUNS = 2000


def policy_config() -> PolicyConfig:
    return PolicyConfig(**settings.SCHEDULER)


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value else None


def similarity_key(workload: dict) -> str:
    """Jobs that are "the same program" for run-time prediction: a built-in, or the script a command runs."""
    if "builtin" in workload:
        return f"builtin:{workload['builtin']}"
    argv = workload.get("command") or [""]
    names = [PurePosixPath(arg).name for arg in argv[:2]]
    script = next((name for name in names if name.endswith(".py")), names[0])
    return f"command:{script}"


def _decayed(gpus: int, start: float, end: float, now: float, half_life: float) -> float:
    """GPU-seconds of one usage segment, each second weighted 2^-(age / half-life) as Slurm's fair share does."""
    rate = math.log(2) / half_life
    return gpus * (math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))) / rate


def _recent_usage(now: float, half_life: float) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    since = datetime.fromtimestamp(now - 4 * half_life, tz=UTC)
    teams: dict[str, float] = defaultdict(float)
    users: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = UsageSegment.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since)).values_list(
        "team__slug", "user__username", "gpus", "started_at", "ended_at"
    )
    for team, user, gpus, started, ended in rows:
        usage = _decayed(gpus, max(started.timestamp(), since.timestamp()), _epoch(ended) or now, now, half_life)
        teams[team] += usage
        users[team][user] += usage
    return teams, users


def _history() -> RuntimeHistory:
    history = RuntimeHistory()
    since = timezone.now() - timedelta(days=HISTORY_DAYS)
    finished = (
        Job.objects.filter(state=Job.State.SUCCEEDED, finished_at__gt=since, started_at__isnull=False)
        .order_by("-finished_at")
        .values_list("user__username", "workload", "gpus", "started_at", "finished_at", "steps_per_second")[
            :HISTORY_RUNS
        ]
    )
    for user, workload, gpus, started, ended, steps_per_second in reversed(finished):
        run = FinishedRun(gpus=gpus, runtime_s=(ended - started).total_seconds(),
                          step_s=1.0 / steps_per_second if steps_per_second else None)
        history.record(user, similarity_key(workload), run)
    return history


def _attained_before_current_run(now: float) -> dict[int, float]:
    """GPU-seconds of each active job's earlier runs (segments that ended; the open one is the current run)."""
    attained: dict[int, float] = defaultdict(float)
    closed = UsageSegment.objects.filter(ended_at__isnull=False, job__state__in=(*Job.HOLDING_STATES, Job.State.QUEUED))
    for job_id, gpus, started, ended in closed.values_list("job_id", "gpus", "started_at", "ended_at"):
        attained[job_id] += gpus * (ended - started).total_seconds()
    return attained


# What the policy needs of each active job, read as plain rows: a pass reads the whole queue every second, and
# building model instances (with their team and user) for 2,000 queued jobs cost 200 ms a pass.
_JOB_FIELDS = {
    "job_id": F("pk"), "team_slug": F("team__slug"), "username": F("user__username"), "gpus_": F("gpus"),
    "priority_": F("priority"), "gpu_type_": F("gpu_type"), "max_steps_": F("max_steps"),
    "steps_done_": F("steps_done"), "steps_per_second_": F("steps_per_second"),
    "time_limit_minutes_": F("time_limit_minutes"), "preemption_count_": F("preemption_count"),
    "workload_": F("workload"), "gpu_share_units_": F("gpu_share_units"), "gpu_memory_mb_": F("gpu_memory_mb"),
    "created_at_": F("created_at"),
}
_HOLDING_FIELDS = {
    "started_at_": F("started_at"), "placed_at_": F("placed_at"), "borrowing_": F("borrowing"),
    "progress_at_": F("progress_at"),
}


def build_snapshot(now: float | None = None, config: PolicyConfig | None = None) -> Snapshot:
    now = now if now is not None else time.time()
    config = config or policy_config()
    hosts = tuple(
        HostView(
            name=host.name,
            schedulable=host.state == Host.State.UP,
            gpus=tuple(
                GpuView(gpu_id=gpu.pk, index=gpu.index, gpu_type=gpu.gpu_type, schedulable=gpu.health == GPU.Health.OK,
                        memory_mb=gpu.memory_mb)
                for gpu in host.gpus.all()
            ),
        )
        for host in Host.objects.prefetch_related(Prefetch("gpus", queryset=GPU.objects.order_by("index")))
    )
    # A job already asked to stop is left out: its GPUs count as free, so the policy does not pick further
    # victims for the same need; placements on them wait (job_place re-checks) until the agent releases them.
    holding = list(Job.objects.filter(state__in=Job.HOLDING_STATES, preempt_requested_at__isnull=True)
                   .values(**_JOB_FIELDS, **_HOLDING_FIELDS))
    queued = Job.objects.filter(state=Job.State.QUEUED).values(**_JOB_FIELDS)
    gpu_ids: dict[int, list[int]] = defaultdict(list)
    for job_id, gpu_id in JobAllocation.objects.filter(released_at__isnull=True).order_by("id").values_list(
            "job_id", "gpu_id"):
        gpu_ids[job_id].append(gpu_id)
    attained = _attained_before_current_run(now)

    def common(job: dict) -> dict:
        return {
            "job_id": job["job_id"],
            "team": job["team_slug"],
            "user": job["username"],
            "gpus": job["gpus_"],
            "priority": Priority.from_name(job["priority_"]),
            "gpu_type": job["gpu_type_"] or None,
            "attained_gpu_seconds": attained.get(job["job_id"], 0.0),
            "declared_steps": job["max_steps_"],
            "steps_done": job["steps_done_"],
            "observed_step_s": 1.0 / job["steps_per_second_"] if job["steps_per_second_"] else None,
            "time_limit_s": job["time_limit_minutes_"] * 60.0,
            "preemption_count": job["preemption_count_"],
            "similarity_key": similarity_key(job["workload_"]),
            "preemptible": job["priority_"] != "urgent",
            "gpu_share": job["gpu_share_units_"] / 100,
            "gpu_memory_mb": job["gpu_memory_mb_"],
            "submitted_at": _epoch(job["created_at_"]) or now,
        }

    running = tuple(
        RunningJob(
            **common(job),
            gpu_ids=tuple(gpu_ids[job["job_id"]]),
            started_at=_epoch(job["started_at_"] or job["placed_at_"]) or now,
            borrowing=job["borrowing_"],
            steps_reported_at=_epoch(job["progress_at_"]),
        )
        for job in holding
    )
    pending = tuple(PendingJob(**common(job)) for job in queued)
    user_caps: dict[str, dict[str, int]] = defaultdict(dict)
    for team_slug, username, cap in UserQuota.objects.values_list("team__slug", "user__username", "max_gpus"):
        user_caps[team_slug][username] = cap
    team_usage, user_usage = _recent_usage(now, config.usage_half_life_s)
    quotas = {
        quota.team.slug: TeamQuotaView(
            team=quota.team.slug,
            max_gpus=quota.max_gpus,
            user_max_gpus=user_caps.get(quota.team.slug, {}),
            share=quota.share,
            recent_usage_gpu_seconds=team_usage.get(quota.team.slug, 0.0),
            may_borrow=quota.may_borrow,
            user_recent_usage_gpu_seconds=dict(user_usage.get(quota.team.slug, {})),
        )
        for quota in TeamQuota.objects.select_related("team")
    }
    return Snapshot(now=now, hosts=hosts, pending=pending, running=running, quotas=quotas, history=_history())


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
    snapshot = build_snapshot(config=config)
    decisions = schedule(snapshot, config)
    preempted = sum(1 for p in decisions.preemptions if services.job_preempt(p.job_id, p.reason))
    placed = 0
    pending_info = {
        job_id: (
            info.reason,
            info.position,
            datetime.fromtimestamp(info.estimated_start, tz=UTC) if info.estimated_start else None,
        )
        for job_id, info in decisions.pending.items()
    }
    for placement in decisions.placements:
        share_units = round(placement.gpu_share * 100)
        if services.job_place(placement.job_id, placement.gpu_ids, borrowing=placement.borrowing,
                              share_units=share_units):
            placed += 1
        else:
            pending_info[placement.job_id] = ("starting: waiting for its GPUs to be released", 1, None)
    services.jobs_set_pending_info(pending_info)
    if decisions.wake_at is not None or preempted:
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
