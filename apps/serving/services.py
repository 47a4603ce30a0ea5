"""Inference services: create, scale and delete them; keep their replicas running; scale on measured load.

A replica is an ordinary inference job (so quotas, priorities, borrowing and preemption apply to it) whose process
is the replica server `workers.runtime.serve`, or, for a service from a user's image, the user's own server in that
image behind the agent's replica gate (workers/agent/replica_gate.py; the contract is in docs/containers.md). The
reconciler (Celery beat, every few seconds) restarts replicas
that ended, polls each ready replica's /stats, publishes the ready endpoints for the gateway, and autoscales;
apps.operations.inference runs it with the services' alert rules watching.
A replica is only ever called at its placement host's registered address and the port it reported, with its
secret (apps.serving.replica_auth).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from apps.accounts import access
from apps.accounts.access import Action
from apps.accounts.models import Team
from apps.jobs.container_spec import checked_environment
from apps.jobs.errors import JobPermissionError, JobSpecError
from apps.jobs.models import Job, JobAllocation
from apps.jobs.services import JobSpec, job_release, job_submit
from apps.jobs.workload_shape import checked_workload
from apps.scheduling.autoscale import MeasuredLoad, ScalingRules, ScalingTargets, decide_replicas
from apps.serving.models import InferenceService, ServiceEvent, ServiceReplica
from apps.serving.replica_auth import replica_headers, replica_url
from workers.runtime.artifacts import safe_job_id, safe_relpath
from workers.runtime.catalog import PRESETS, WORKLOADS

logger = logging.getLogger(__name__)
STATS_TTL_S = 30
# A ready replica stays routed through this many seconds of failed /stats polls (Kubernetes' readiness
# failureThreshold): one poll timing out on a busy host must not empty the gateway's list. A replica that really died
# costs the gateway one retry on another replica meanwhile, and its job's end retires it at once.
READY_GRACE_S = 10.0


def replicas_key(service_id: int) -> str:
    return f"serving:replicas:{service_id}"


def stats_key(service_id: int) -> str:
    return f"serving:stats:{service_id}"


def answered_key(job_id: int, attempt: int) -> str:
    return f"serving:answered:{job_id}:{attempt}"


@dataclass(frozen=True)
class ServiceSpec:
    team: Team
    name: str
    workload: str = ""
    checkpoint: str = ""
    preset: str = "infer-fp32"
    gpus_per_replica: int = 1
    min_replicas: int = 1
    max_replicas: int = 1
    target_p95_ms: float | None = None
    target_rps_per_replica: float | None = None
    max_batch: int = 32
    max_wait_ms: float = 5.0
    batching: bool = True
    # A service from a user's image: its server's argv in that image, plain variables, names of team secrets.
    image: str = ""
    command: Any = None
    env: Any = None
    secrets: Any = None


def _inside_job(checkpoint: str) -> bool:
    """'<job id>/<path>' with a path the artifact store accepts (no '..', absolute part, backslash or NUL)."""
    job_id, _, path = checkpoint.partition("/")
    try:
        safe_job_id(job_id)
        safe_relpath(path)
    except ValueError:
        return False
    return True


def _validate_image(spec: ServiceSpec, errors: dict[str, object]) -> None:
    """A service from a user's image: its image, env and secrets are checked as a job's, its command as a job's
    argv; a built-in workload or checkpoint does not go with it."""
    if not spec.image:
        errors["image"] = ["A service with a command runs it in an image: give the image too."]
    if spec.command is None or spec.command == []:
        errors["command"] = ["Give the argv of the service's server in its image (it answers the HTTP contract in "
                             "docs/containers.md)."]
    else:
        _, problem = checked_workload({"command": spec.command})
        if problem is not None:
            errors["command"] = problem.get("command", problem) if isinstance(problem, dict) else problem
    if spec.workload:
        errors["workload"] = ["A service serves either a built-in workload or its own image, not both."]
    if spec.checkpoint:
        errors["checkpoint"] = ["Only a built-in workload's service loads a checkpoint; an image brings its own."]
    checked_environment(image=spec.image, env=spec.env, secrets=spec.secrets, mounts=None, code=None, shm_gb=None,
                        team=spec.team, memory_gb=0.0, errors=errors)


def _validate(spec: ServiceSpec) -> None:
    errors: dict[str, object] = {}
    if spec.image or spec.command is not None:
        _validate_image(spec, errors)
    else:
        workload = WORKLOADS.get(spec.workload)
        if workload is None or "inference" not in workload.kinds:
            errors["workload"] = [f"Unknown built-in workload '{spec.workload}'; GET /api/v1/workloads/ lists "
                                  "them, or give an image and a command."]
        for name in ("env", "secrets"):
            if getattr(spec, name):
                errors[name] = ["Only for a service from an image (give image and command)."]
    preset = PRESETS.get(spec.preset)
    if preset is None or preset.kind != "inference":
        errors["preset"] = [f"'{spec.preset}' is not an inference preset (infer-fp32, infer-fp16, infer-bf16, "
                            "infer-int8, infer-compiled)."]
    if spec.min_replicas > spec.max_replicas:
        errors["min_replicas"] = ["min_replicas may not exceed max_replicas."]
    if spec.checkpoint:
        job_id = spec.checkpoint.split("/", 1)[0]
        source = Job.objects.filter(pk=int(job_id) if job_id.isdigit() else 0).first()
        if source is None or source.team_id != spec.team.pk:
            errors["checkpoint"] = ["The checkpoint must come from a job of the same team: '<job id>/<path>'."]
        elif not _inside_job(spec.checkpoint):
            errors["checkpoint"] = ["The checkpoint path must stay inside the job's artifacts."]
    if errors:
        raise JobSpecError(errors)


def service_create(*, user: AbstractBaseUser, spec: ServiceSpec) -> InferenceService:
    access.require(user, Action.SUBMIT, spec.team, f"Only members of team {spec.team.slug} may create its services.",
                   error=JobPermissionError)
    _validate(spec)
    if InferenceService.objects.filter(team=spec.team, name=spec.name).exclude(
            state=InferenceService.State.DELETED).exists():
        raise JobSpecError({"name": [f"Team {spec.team.slug} already has a service named '{spec.name}'."]})
    with transaction.atomic():
        service = InferenceService.objects.create(
            team=spec.team, name=spec.name, owner=user, workload=spec.workload, checkpoint=spec.checkpoint,
            preset=spec.preset, gpus_per_replica=spec.gpus_per_replica, min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas, target_p95_ms=spec.target_p95_ms,
            target_rps_per_replica=spec.target_rps_per_replica, max_batch=spec.max_batch,
            max_wait_ms=spec.max_wait_ms, batching=spec.batching, desired_replicas=spec.min_replicas or 1,
            image=spec.image, command=spec.command or [], env=spec.env or {}, secrets=spec.secrets or [],
        )
        _event(service, "created", f"created by {user.get_username()} with {service.desired_replicas} replica(s)")
        for _ in range(service.desired_replicas):
            _start_replica(service, "initial replica")
    return service


def service_scale(*, service: InferenceService, user: AbstractBaseUser, changes: dict[str, Any]) -> InferenceService:
    access.require(user, Action.MANAGE_SERVICE, service, "Only the team's members may scale its services.",
                   error=JobPermissionError)
    with transaction.atomic():
        service = InferenceService.objects.select_for_update().get(pk=service.pk)
        for name in ("min_replicas", "max_replicas", "target_p95_ms", "target_rps_per_replica"):
            if name in changes:
                setattr(service, name, changes[name])
        if service.min_replicas > service.max_replicas:
            raise JobSpecError({"min_replicas": ["min_replicas may not exceed max_replicas."]})
        desired = min(max(service.desired_replicas, service.min_replicas), service.max_replicas)
        if desired != service.desired_replicas:
            _event(service, "scale", f"replicas {service.desired_replicas} → {desired}: bounds changed by "
                                     f"{user.get_username()}")
            service.desired_replicas = desired
        service.save()
    return service


def service_delete(*, service: InferenceService, user: AbstractBaseUser) -> InferenceService:
    access.require(user, Action.MANAGE_SERVICE, service, "Only the team's members may delete its services.",
                   error=JobPermissionError)
    with transaction.atomic():
        service = InferenceService.objects.select_for_update().get(pk=service.pk)
        if service.state == InferenceService.State.DELETED:
            return service
        for replica in service.replicas.filter(retired=False).select_related("job"):
            job_release(replica.job_id, f"service {service} deleted by {user.get_username()}")
            ServiceReplica.objects.filter(pk=replica.pk).update(retired=True)
        service.state = InferenceService.State.DELETED
        service.save(update_fields=["state"])
        _event(service, "deleted", f"deleted by {user.get_username()}; its replicas were stopped")
    cache.delete_many([replicas_key(service.pk), stats_key(service.pk)])
    return service


def _event(service: InferenceService, kind: str, reason: str, **data: Any) -> None:
    ServiceEvent.objects.create(service=service, kind=kind, reason=reason[:500], data=data)


def _start_replica(service: InferenceService, reason: str) -> ServiceReplica:
    if service.image:  # the user's server behind the agent's replica gate: no batching of ours
        serve: dict[str, Any] = {"command": list(service.command)}
    else:
        serve = {"workload": service.workload, "checkpoint": service.checkpoint, "max_batch": service.max_batch,
                 "max_wait_ms": service.max_wait_ms, "batching": service.batching}
    spec = JobSpec(
        name=f"{service.name}-replica", kind=Job.Kind.INFERENCE, gpus=service.gpus_per_replica, team=service.team.slug,
        preset=service.preset, time_limit_minutes=settings.JOBS_MAX_TIME_LIMIT_MINUTES, max_retries=3,
        workload={"serve": serve}, image=service.image, env=service.env or None, secrets=service.secrets or None,
    )
    job = job_submit(user=service.owner, spec=spec, replica=True, service_group=f"service:{service.pk}")
    replica = ServiceReplica.objects.create(service=service, job=job)
    _event(service, "replica_started", f"replica job {job.pk} submitted: {reason}", job=job.pk)
    return replica


# --- the reconciler


def _poll(target: dict[str, Any]) -> dict[str, Any] | None:
    url = replica_url(target["address"], target["port"])
    try:
        response = httpx.get(f"{url}/stats", timeout=1.0, headers=replica_headers(target["job"], target["attempt"]))
        response.raise_for_status()
        stats = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return stats if isinstance(stats, dict) else None


def _placement_address(job: Job) -> str | None:
    """The registered address of the one host the job holds GPUs on (allocations prefetched), else None."""
    hosts = {allocation.gpu.host for allocation in job.active_allocations}
    if len(hosts) != 1:
        return None
    host = hosts.pop()
    return host.address or host.name


def replica_target(job: Job) -> dict[str, Any] | None:
    """Where a running replica is called: its placement host's registered address and the port its current
    attempt reported (through that host's agent). None while there is no such endpoint, or when it fails the
    checks (then it is never called)."""
    info = job.runtime_info
    if job.state != Job.State.RUNNING or info.get("attempt") != job.attempts or "port" not in info:
        return None
    target = {"job": job.pk, "attempt": job.attempts, "address": _placement_address(job), "port": info["port"]}
    try:
        replica_url(target["address"], target["port"])
    except ValueError as exc:
        logger.warning("replica job %s is not called: %s", job.pk, exc)
        return None
    return target


# What a reconcile pass hands its observer (the service's alert rules, in apps.operations.inference): the service,
# its replicas' summary and the time.
Observer = Callable[[InferenceService, dict[str, Any], float], None]


def reconcile(service: InferenceService, now: float | None = None, *, observe: Observer | None = None
              ) -> dict[str, Any]:
    """Bring the service to its desired replicas, scaled on what its replicas report; `observe` sees the
    summary before the scaling decision."""
    now = now or time.time()
    live: list[ServiceReplica] = []
    active = JobAllocation.objects.filter(released_at__isnull=True).select_related("gpu__host")
    replicas = service.replicas.filter(retired=False).select_related("job").prefetch_related(
        Prefetch("job__allocations", queryset=active, to_attr="active_allocations"))
    for replica in replicas:
        if replica.job.is_final:
            ServiceReplica.objects.filter(pk=replica.pk).update(retired=True)
            _event(service, "replica_ended", f"replica job {replica.job_id} {replica.job.state}: "
                                             f"{replica.job.failure_reason or 'ended'}", job=replica.job_id)
        else:
            live.append(replica)
    ready, stats = [], []
    for replica in live:
        target = replica_target(replica.job)
        if target is None:
            continue
        polled = _poll(target)
        if polled is not None:
            cache.set(answered_key(target["job"], target["attempt"]), now, timeout=STATS_TTL_S)
            ready.append(target)
            stats.append(polled)
        elif now - (cache.get(answered_key(target["job"], target["attempt"])) or float("-inf")) <= READY_GRACE_S:
            ready.append(target)
    summary = _summarize(stats, len(live), len(ready))
    if observe is not None:
        observe(service, summary, now)
    desired, reason = autoscale_decision(service, summary, now)
    with transaction.atomic():
        if desired != service.desired_replicas:
            _event(service, "scale_up" if desired > service.desired_replicas else "scale_down",
                   f"replicas {service.desired_replicas} → {desired}: {reason}", **summary)
            InferenceService.objects.filter(pk=service.pk).update(desired_replicas=desired,
                                                                  last_scaled_at=timezone.now())
            service.desired_replicas = desired
        for _ in range(service.desired_replicas - len(live)):
            _start_replica(service, "keeping the service at its desired replicas")
        surplus = len(live) - service.desired_replicas
        # Scale down the replicas that are not serving yet first, then the newest.
        retiring = sorted(live, key=lambda r: (r.job.state == Job.State.RUNNING, -r.pk))[:max(surplus, 0)]
        for replica in retiring:
            job_release(replica.job_id, f"service {service} scaled down")
            ServiceReplica.objects.filter(pk=replica.pk).update(retired=True)
    retired = {replica.job_id for replica in retiring}
    ready = [r for r in ready if r["job"] not in retired]
    summary["ready"] = len(ready)
    summary["replicas"] = len(live) - len(retired)
    cache.set(replicas_key(service.pk), ready, timeout=STATS_TTL_S)
    cache.set(stats_key(service.pk), summary, timeout=STATS_TTL_S)
    return summary


def _summarize(stats: list[dict[str, Any]], live: int, ready: int) -> dict[str, Any]:
    def worst(key: str) -> float | None:
        values = [s["latency_ms"][key] for s in stats if s.get("latency_ms", {}).get(key) is not None]
        return max(values) if values else None

    requests = sum(s.get("requests", 0) for s in stats)
    window_requests = sum(int(s.get("window_requests", 0)) for s in stats)
    errors = sum(s.get("errors", 0) for s in stats)
    return {
        "replicas": live, "ready": ready, "rps": round(sum(s.get("rps", 0.0) for s in stats), 3),
        "p50_ms": worst("p50"), "p95_ms": worst("p95"), "p99_ms": worst("p99"),
        "queue_depth": sum(s.get("queue_depth", 0) for s in stats),
        "error_rate": round(errors / requests, 4) if requests else 0.0, "requests": requests,
        "window_requests": window_requests,
    }


def autoscale_decision(service: InferenceService, summary: dict[str, Any], now: float) -> tuple[int, str]:
    """The replica count the measured load asks for: the core's rule (apps.scheduling.autoscale) on this pass."""
    targets = ScalingTargets(min_replicas=service.min_replicas, max_replicas=service.max_replicas,
                             target_p95_ms=service.target_p95_ms,
                             target_rps_per_replica=service.target_rps_per_replica, max_batch=service.max_batch)
    load = MeasuredLoad(live=summary.get("replicas", summary["ready"]), ready=summary["ready"], rps=summary["rps"],
                        window_requests=summary.get("window_requests", 0), p95_ms=summary["p95_ms"],
                        queue_depth=summary["queue_depth"])
    last = service.last_scaled_at.timestamp() if service.last_scaled_at else float("-inf")
    return decide_replicas(service.desired_replicas, targets, load, now - last,
                           ScalingRules(down_stabilization_s=float(settings.SERVING_SCALE_DOWN_AFTER_S)))


def reconcile_all(*, observe: Observer | None = None) -> int:
    count = 0
    for service in InferenceService.objects.filter(state=InferenceService.State.ACTIVE).select_related("team",
                                                                                                      "owner"):
        try:
            reconcile(service, observe=observe)
            count += 1
        except Exception:  # noqa: BLE001 - one broken service must not stop the others
            logger.exception("reconciling service %s failed", service)
    return count


def service_stats(service: InferenceService) -> dict[str, Any]:
    return cache.get(stats_key(service.pk)) or {"replicas": 0, "ready": 0, "rps": 0.0, "p50_ms": None,
                                                 "p95_ms": None, "p99_ms": None, "queue_depth": 0,
                                                 "error_rate": 0.0, "requests": 0, "window_requests": 0}


def ready_replicas(service_id: int) -> list[dict[str, Any]]:
    return cache.get(replicas_key(service_id)) or []


def recent_events(service: InferenceService, since: timedelta = timedelta(days=7)):
    return service.events.filter(created_at__gte=timezone.now() - since)
