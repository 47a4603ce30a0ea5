"""Alert rules over telemetry: conditions held for a duration fire alerts, alerts feed back into the cluster.

A hot GPU is marked so that the scheduler places nothing new on it (and its job can be checkpointed and moved);
a faulty one (XID) likewise until an admin clears it; an idle job is warned, then, after a grace period,
checkpointed and released where the rule says (idle_release.py). An alert resolves when its condition ends: the
GPU cools, the host is heard from again, the job's run is over, the service is deleted (`sweep`, each reaper pass).
Condition start times live in the Django cache, so several ASGI processes agree on them.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.accounts import access
from apps.cluster.models import GPU, Host
from apps.telemetry import idle_release
from apps.telemetry.models import Alert, AlertRule

logger = logging.getLogger(__name__)
RULES_TTL_S = 5.0
PENDING_TTL_S = 3600
TEMPERATURE_HYSTERESIS_C = 3.0
GPU_KINDS = (AlertRule.Kind.GPU_TEMPERATURE, AlertRule.Kind.GPU_MEMORY, AlertRule.Kind.GPU_NO_DATA,
             AlertRule.Kind.JOB_IDLE)


@dataclass
class RuleView:
    id: int
    name: str
    kind: str
    threshold: float
    duration_s: int
    action: str
    severity: str
    team_ids: frozenset[int]


class _Rules:
    def __init__(self) -> None:
        self.loaded_at = 0.0
        self.rules: list[RuleView] = []
        self.open: set[tuple[int, str]] = set()
        self.lock = threading.Lock()

    def load(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self.loaded_at < RULES_TTL_S:
            return
        rules = [
            RuleView(r.pk, r.name, r.kind, r.threshold, r.duration_s, r.action, r.severity,
                     frozenset(r.teams.values_list("pk", flat=True)))
            for r in AlertRule.objects.filter(enabled=True).prefetch_related("teams")
        ]
        open_alerts = set(Alert.objects.exclude(state=Alert.State.RESOLVED).values_list("rule_id", "subject"))
        with self.lock:
            self.rules, self.open, self.loaded_at = rules, open_alerts, time.monotonic()

    def of_kind(self, *kinds: str) -> list[RuleView]:
        self.load()
        return [rule for rule in self.rules if rule.kind in kinds]


rules = _Rules()


def reload_rules() -> None:
    rules.load(force=True)


def _pending_key(rule_id: int, subject: str) -> str:
    return f"alert:pending:{rule_id}:{subject}"


def _gpu_condition(rule: RuleView, gpu: dict[str, Any]) -> tuple[bool, bool, float | None]:
    """(condition holds, condition clearly cleared, value) for one GPU sample."""
    if rule.kind == AlertRule.Kind.GPU_NO_DATA:
        return not gpu["available"], gpu["available"], None
    if not gpu["available"]:
        return False, False, None
    if rule.kind == AlertRule.Kind.GPU_TEMPERATURE:
        temp = gpu["temperature_c"]
        if temp is None:
            return False, False, None
        return temp >= rule.threshold, temp < rule.threshold - TEMPERATURE_HYSTERESIS_C, temp
    if rule.kind == AlertRule.Kind.GPU_MEMORY:
        used, total = gpu["memory_used_mb"], gpu["memory_total_mb"]
        if not used or not total:
            return False, True, None
        percent = 100.0 * used / total
        return percent >= rule.threshold, percent < rule.threshold, percent
    if rule.kind == AlertRule.Kind.JOB_IDLE:
        util = gpu["utilization_pct"]
        if gpu["job"] is None or util is None:
            return False, True, None
        return util < rule.threshold, util >= rule.threshold, util
    return False, False, None


def _subject(rule: RuleView, gpu: dict[str, Any]) -> str:
    return f"job:{gpu['job']}" if rule.kind == AlertRule.Kind.JOB_IDLE else f"gpu:{gpu['uuid']}"


def evaluate_gpu_samples(host: Host, gpus: list[dict[str, Any]], maps: Any, now: float) -> None:
    active = rules.of_kind(*GPU_KINDS)
    if not active:
        return
    keys = {(rule.id, gpu["uuid"]): _pending_key(rule.id, f"{_subject(rule, gpu)}:{gpu['uuid']}")
            for rule in active for gpu in gpus}
    pending = cache.get_many(list(keys.values()))
    started, cleared = {}, []
    for rule in active:
        for gpu in gpus:
            holds, clear, value = _gpu_condition(rule, gpu)
            key = keys[(rule.id, gpu["uuid"])]
            subject = _subject(rule, gpu)
            if holds:
                since = pending.get(key)
                if since is None:
                    started[key] = since = now
                if now - since >= rule.duration_s and (rule.id, subject) not in rules.open:
                    _fire_for_gpu(rule, host, gpu, maps, subject, value, since, now)
            else:
                if key in pending:
                    cleared.append(key)
                if clear and (rule.id, subject) in rules.open and not _idle_job_stopping(rule, gpu):
                    resolve(rule.id, subject, f"{rule.name}: cleared")
    if started:
        cache.set_many(started, timeout=PENDING_TTL_S)
    if cleared:
        cache.delete_many(cleared)


def _idle_job_stopping(rule: RuleView, gpu: dict[str, Any]) -> bool:
    """Was the job of an idle alert asked to stop (checkpoint for release, preemption)? Its exit costs CPU, which
    the simulated GPU reads as a busy moment: that must not call off a release already under way, nor should its
    last idle seconds open a second alert. The alert resolves when the run is over (`sweep`)."""
    if rule.kind != AlertRule.Kind.JOB_IDLE or gpu["job"] is None:
        return False
    from apps.jobs.models import Job

    return Job.objects.filter(pk=gpu["job"], preempt_requested_at__isnull=False).exists()


def _describe(rule: RuleView, host: Host, gpu: dict[str, Any], value: float | None) -> str:
    where = f"{host.name}:{gpu['index']} ({gpu['gpu_type']})"
    if rule.kind == AlertRule.Kind.GPU_TEMPERATURE:
        return f"GPU {where} at {value:.0f} °C for {rule.duration_s} s (threshold {rule.threshold:.0f} °C)"
    if rule.kind == AlertRule.Kind.GPU_MEMORY:
        return f"GPU {where} memory {value:.0f} % full for {rule.duration_s} s"
    if rule.kind == AlertRule.Kind.GPU_NO_DATA:
        return f"GPU {where} is not answering ({gpu.get('error') or 'no data'}) for {rule.duration_s} s"
    return (f"job {gpu['job']} idle on GPU {where}: {value:.0f} % utilization for {rule.duration_s // 60} min "
            f"(threshold {rule.threshold:.0f} %)")


def _fire_for_gpu(rule: RuleView, host: Host, gpu: dict[str, Any], maps: Any, subject: str, value: float | None,
                  since: float, now: float) -> Alert | None:
    info = maps.gpus[gpu["uuid"]]
    job_id = gpu["job"]
    team_id = None
    if job_id is not None:
        from apps.jobs.models import Job

        found = (Job.objects.filter(pk=job_id)
                 .values_list("team_id", "state", "started_at", "preempt_requested_at").first())
        if found is None:
            return None
        team_id, state, started_at, stop_requested_at = found
        if rule.kind == AlertRule.Kind.JOB_IDLE and (
            state != Job.State.RUNNING
            or stop_requested_at is not None
            or (started_at is not None and now - max(since, started_at.timestamp()) < rule.duration_s)
        ):
            # A sample of a run that is over (the host's GPU-to-job map is cached for MAP_TTL_S) or asked to stop;
            # a run still starting (placed: dispatched, its image pulled, its code fetched), whose GPUs are not yet
            # its process's to use; or a run whose idle time is counted from its process's start, not from an
            # earlier run's nor from its placement (CI: a start slowed by load read idle, then busy, and the rule
            # fired twice).
            return None
    message = _describe(rule, host, gpu, value)
    if job_id is not None and idle_release.applies(rule, team_id):
        message += idle_release.warning_suffix()
    return fire(rule, subject, message, value=value, host_id=host.pk, gpu_id=info.gpu_id, job_id=job_id,
                team_id=team_id)


def fire(rule: RuleView | AlertRule, subject: str, message: str, *, value: float | None = None,
         host_id: int | None = None, gpu_id: int | None = None, job_id: int | None = None,
         team_id: int | None = None) -> Alert | None:
    """Open an alert (once per rule and subject) and apply the rule's action. None if one is already open."""
    try:
        with transaction.atomic():
            alert = Alert.objects.create(rule_id=rule.id if isinstance(rule, RuleView) else rule.pk,
                                         subject=subject[:120], message=message[:500], value=value,
                                         host_id=host_id, gpu_id=gpu_id, job_id=job_id, team_id=team_id)
            _apply_action(rule, alert)
            transaction.on_commit(lambda: _notify_later(alert.pk))
    except IntegrityError:
        rules.open.add((alert_rule_id(rule), subject))
        return None
    rules.open.add((alert_rule_id(rule), subject))
    logger.warning("alert fired: %s", message)
    return alert


def alert_rule_id(rule: RuleView | AlertRule) -> int:
    return rule.id if isinstance(rule, RuleView) else rule.pk


def _apply_action(rule: RuleView | AlertRule, alert: Alert) -> None:
    action = rule.action
    if action in (AlertRule.Action.MARK_HOT, AlertRule.Action.CHECKPOINT_JOB) and alert.gpu_id:
        GPU.objects.filter(pk=alert.gpu_id, health=GPU.Health.OK).update(
            health=GPU.Health.HOT, health_reason=f"alert {alert.pk}: {alert.message}"[:200])
    if action == AlertRule.Action.MARK_FAULTY and alert.gpu_id:
        GPU.objects.filter(pk=alert.gpu_id).exclude(health=GPU.Health.FAULTY).update(
            health=GPU.Health.FAULTY, health_reason=f"alert {alert.pk}: {alert.message}"[:200])
    if alert.job_id and action == AlertRule.Action.CHECKPOINT_JOB:
        from apps.jobs.services import job_preempt

        job_preempt(alert.job_id, f"its GPU needs attention: {alert.message}")
    if alert.job_id and idle_release.applies(rule, alert.team_id):
        # Only the warning now: the release follows the grace period, if the condition still holds then.
        idle_release.warn(alert)


def fire_xid(host: Host, gpu_id: int, xid: int, ts: float) -> None:
    for rule in rules.of_kind(AlertRule.Kind.GPU_XID):
        gpu = GPU.objects.filter(pk=gpu_id).values("index", "gpu_type", "uuid").first()
        from workers.agent.gpus import XID_DESCRIPTIONS

        what = XID_DESCRIPTIONS.get(xid, "see NVIDIA's XID catalogue")
        from apps.jobs.models import JobAllocation

        allocation = (JobAllocation.objects.filter(gpu_id=gpu_id, released_at__isnull=True)
                      .values("job_id", "job__team_id").first())
        fire(rule, f"gpu:{gpu['uuid']}", f"XID {xid} on GPU {host.name}:{gpu['index']} ({gpu['gpu_type']}): {what}",
             value=float(xid), host_id=host.pk, gpu_id=gpu_id,
             job_id=allocation["job_id"] if allocation else None,
             team_id=allocation["job__team_id"] if allocation else None)


def resolve(rule_id: int, subject: str, note: str = "") -> int:
    """Resolve the open alert of a rule and subject; undo a hot mark it set. Returns alerts resolved."""
    with transaction.atomic():
        open_alerts = list(Alert.objects.select_for_update().filter(rule_id=rule_id, subject=subject)
                           .exclude(state=Alert.State.RESOLVED))
        for alert in open_alerts:
            Alert.objects.filter(pk=alert.pk).update(state=Alert.State.RESOLVED, resolved_at=timezone.now())
            if alert.gpu_id:
                GPU.objects.filter(pk=alert.gpu_id, health=GPU.Health.HOT,
                                   health_reason__startswith=f"alert {alert.pk}:").update(
                    health=GPU.Health.OK, health_reason="")
            idle_release.called_off(alert, note)
    rules.open.discard((rule_id, subject))
    if open_alerts:
        logger.info("alert resolved: %s %s", subject, note)
    return len(open_alerts)


def acknowledge(alert: Alert, user: Any) -> bool:
    """Mark a firing alert acknowledged (site admins, the team's managers); False when it no longer fired."""
    access.require(user, access.Action.ACK_ALERT, alert)
    return bool(Alert.objects.filter(pk=alert.pk, state=Alert.State.FIRING).update(
        state=Alert.State.ACKNOWLEDGED, acknowledged_at=timezone.now(), acknowledged_by=user))


def resolve_by_hand(alert: Alert, user: Any) -> bool:
    """An admin closes an alert (e.g. after replacing a faulty GPU): the GPU takes work again."""
    access.require(user, access.Action.RESOLVE_ALERT, alert)
    with transaction.atomic():
        changed = Alert.objects.filter(pk=alert.pk).exclude(state=Alert.State.RESOLVED).update(
            state=Alert.State.RESOLVED, resolved_at=timezone.now())
        if changed and alert.gpu_id:
            GPU.objects.filter(pk=alert.gpu_id, health_reason__startswith=f"alert {alert.pk}:").update(
                health=GPU.Health.OK, health_reason="")
    rules.open.discard((alert.rule_id, alert.subject))
    return bool(changed)


# --- host and job checks run periodically (Celery beat)


def check_hosts() -> dict[str, int]:
    """Host heartbeat rules, by the hosts' states now: an alert is open exactly while its host is down after
    having been heard from (a host whose agent never came is not missing heartbeats). Resolves the alerts of
    hosts that are back, however they came back (a heartbeat, or the registration of a restarted agent)."""
    counts = {"fired": 0, "resolved": 0}
    host_rules = rules.of_kind(AlertRule.Kind.HOST_HEARTBEAT)
    if not host_rules:
        return counts
    now = timezone.now()
    down = [(pk, name, last) for pk, name, last in Host.objects.filter(
        state=Host.State.DOWN, last_heartbeat__isnull=False).values_list("pk", "name", "last_heartbeat")
            if last is not None]
    for rule in host_rules:
        for host_id, name, last in down:
            if (rule.id, f"host:{name}") not in rules.open:
                silent = (now - last).total_seconds()
                counts["fired"] += bool(fire(rule, f"host:{name}", f"host {name} missed heartbeats for "
                                             f"{silent:.0f} s: marked down", host_id=host_id))
        down_names = {f"host:{name}" for _, name, _ in down}
        for subject in (Alert.objects.filter(rule_id=rule.id, subject__startswith="host:")
                        .exclude(state=Alert.State.RESOLVED).values_list("subject", flat=True)):
            if subject not in down_names:
                counts["resolved"] += resolve(rule.id, subject, "heartbeats resumed")
    return counts


def host_heard_from(host: Host) -> int:
    """A heartbeat came from `host`: resolve its missing-heartbeat alert if one is open. Returns alerts resolved."""
    subject = f"host:{host.name}"
    return sum(resolve(rule.id, subject, "heartbeats resumed")
               for rule in rules.of_kind(AlertRule.Kind.HOST_HEARTBEAT) if (rule.id, subject) in rules.open)


def check_overrunning_jobs(now: float | None = None) -> int:
    """Running jobs past their expected end (declared steps at the observed step rate), by the rule's ratio."""
    from apps.jobs.models import Job

    fired = 0
    now = now or time.time()
    for rule in rules.of_kind(AlertRule.Kind.JOB_OVERRUN):
        ratio = rule.threshold or 1.0
        running = Job.objects.filter(state=Job.State.RUNNING, max_steps__isnull=False,
                                     steps_per_second__gt=0, started_at__isnull=False)
        for job in running.only("pk", "team_id", "max_steps", "steps_per_second", "started_at", "steps_done"):
            expected_s = job.max_steps / job.steps_per_second
            elapsed = now - job.started_at.timestamp()
            if elapsed > expected_s * ratio + 60 and job.steps_done < job.max_steps:
                alert = fire(rule, f"job:{job.pk}",
                             f"job {job.pk} has run {elapsed / 60:.0f} min, past its expected {expected_s / 60:.0f} min",
                             job_id=job.pk, team_id=job.team_id, value=elapsed)
                fired += bool(alert)
    return fired


def resolve_alerts_of_finished_jobs() -> int:
    """Alerts about a job whose run they were about is over: the job ended, went back to the queue, or was placed
    again since the alert fired (a later attempt, not the one the alert was about)."""
    from django.db.models import F, Q

    from apps.jobs.models import Job

    open_job_alerts = Alert.objects.exclude(state=Alert.State.RESOLVED).filter(subject__startswith="job:").filter(
        Q(job__state__in=[*Job.FINAL_STATES, Job.State.QUEUED]) | Q(job__placed_at__gt=F("started_at")))
    return sum(resolve(rule_id, subject, "the run it was about is over") for rule_id, subject in
               open_job_alerts.values_list("rule_id", "subject"))


def resolve_alerts_of_deleted_services() -> int:
    """Service rules' alerts whose service is deleted (or gone): nothing is left to be slow or failing."""
    from apps.serving.models import InferenceService

    live = {f"service:{pk}" for pk in InferenceService.objects.exclude(state=InferenceService.State.DELETED)
            .values_list("pk", flat=True)}
    open_service_alerts = (Alert.objects.exclude(state=Alert.State.RESOLVED).filter(subject__startswith="service:")
                           .values_list("rule_id", "subject"))
    return sum(resolve(rule_id, subject, "service deleted") for rule_id, subject in open_service_alerts
               if subject not in live)


def sweep() -> dict[str, int]:
    """The alert checks that follow the records rather than samples, run by each reaper pass: host alerts by the
    hosts' states, alerts of runs that are over and of deleted services resolved, idle releases due."""
    hosts = check_hosts()
    return {"host_alerts_fired": hosts["fired"], "host_alerts_resolved": hosts["resolved"],
            "job_alerts_resolved": resolve_alerts_of_finished_jobs(),
            "service_alerts_resolved": resolve_alerts_of_deleted_services(),
            "idle_releases": idle_release.release_due()}


def _notify_later(alert_id: int) -> None:
    try:
        from apps.telemetry.tasks import notify_alert

        notify_alert.delay(alert_id)
    except Exception:  # noqa: BLE001 - a broker outage must not lose the alert itself
        logger.warning("could not queue the notification of alert %s", alert_id, exc_info=True)


def notify(alert_id: int) -> dict[str, int]:
    """E-mail the job's owner and the admins, and call the rule's webhook."""
    from django.contrib.auth import get_user_model
    from django.core.mail import send_mail

    alert = Alert.objects.select_related("rule", "job__user").filter(pk=alert_id).first()
    if alert is None:
        return {"emails": 0, "webhooks": 0}
    sent = {"emails": 0, "webhooks": 0}
    if alert.rule.notify_email:
        recipients = set(get_user_model().objects.filter(is_staff=True, is_active=True).exclude(email="")
                         .values_list("email", flat=True))
        if alert.job and alert.job.user.email:
            recipients.add(alert.job.user.email)
        if recipients:
            sent["emails"] = send_mail(f"[GPU console] {alert.rule.severity}: {alert.rule.name}", alert.message,
                                       None, sorted(recipients), fail_silently=True)
    if alert.rule.webhook_url:
        import httpx

        payload = {"id": alert.pk, "rule": alert.rule.name, "severity": alert.rule.severity, "state": alert.state,
                   "message": alert.message, "job": alert.job_id, "started_at": alert.started_at.isoformat()}
        try:
            httpx.post(alert.rule.webhook_url, json=payload, timeout=5).raise_for_status()
            sent["webhooks"] = 1
        except httpx.HTTPError as exc:
            logger.warning("webhook for alert %s failed: %s", alert.pk, exc)
    return sent


def evaluate_service(service, summary: dict[str, Any], now: float | None = None) -> None:
    """Service rules: p95 above the target (× threshold) or errors at/above the threshold, held for the duration."""
    now = now or time.time()
    for rule in rules.of_kind(AlertRule.Kind.SERVICE_LATENCY, AlertRule.Kind.SERVICE_ERRORS):
        subject = f"service:{service.pk}"
        if rule.kind == AlertRule.Kind.SERVICE_LATENCY:
            target, p95 = service.target_p95_ms, summary.get("p95_ms")
            if target is None:
                continue
            limit = target * (rule.threshold or 1.0)
            holds, clear = p95 is not None and p95 > limit, p95 is None or p95 <= limit
            message = f"service {service} p95 {p95 or 0:.0f} ms above {limit:.0f} ms for {rule.duration_s} s"
        else:
            rate = summary.get("error_rate", 0.0)
            holds, clear = rate >= rule.threshold > 0, rate < rule.threshold
            message = f"service {service} error rate {rate:.1%} for {rule.duration_s} s"
        key = _pending_key(rule.id, subject)
        since = cache.get(key)
        if holds:
            if since is None:
                cache.set(key, since := now, timeout=PENDING_TTL_S)
            if now - since >= rule.duration_s and (rule.id, subject) not in rules.open:
                fire(rule, subject, message, team_id=service.team_id, value=summary.get("p95_ms"))
        else:
            if since is not None:
                cache.delete(key)
            if clear and (rule.id, subject) in rules.open:
                resolve(rule.id, subject, "back within target")


def report_inconsistency(found: dict[str, int]) -> None:
    rule, _ = AlertRule.objects.get_or_create(kind=AlertRule.Kind.LEDGER,
                                              defaults={"name": "Ledger repaired", "severity": "critical"})
    stamp = int(time.time())
    fire(rule, f"ledger:{stamp}", "GPU allocation records were out of step with jobs and were repaired: "
                                  + ", ".join(f"{k}={v}" for k, v in found.items() if v))
