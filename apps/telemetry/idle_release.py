"""Idle release, in steps the job's owner sees: warn, grace period, checkpoint, release.

A rule with the action `release_job` (an idle job, usually) that fires for a job of a team it applies to:
1. warns: the alert (e-mailed to the job's owner) says when the job will be released, and the same words are an
   event on the job;
2. waits `settings.IDLE_RELEASE_GRACE_S`: if the condition clears meanwhile (the GPUs got busy) the alert resolves
   and an event on the job says the release is called off;
3. when the grace is over and the alert still open, asks the job to checkpoint (`job_checkpoint_and_release`:
   SIGTERM, the preemption's grace; an event on the job);
4. releases it: the job ends cancelled once its agent reports it stopped, its GPUs held until then.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from apps.jobs.models import Job, JobEvent
from apps.telemetry.models import Alert, AlertRule

WARNING_MARK = "idle_alert"  # in the data of the warning's event on the job: the alert's id


def applies(rule: Any, team_id: int | None) -> bool:
    """Does the rule release jobs of this team (a rule's teams, none: every team)? `rule` is an AlertRule or
    the alerts' cached view of one (which carries its team_ids)."""
    if rule.action != AlertRule.Action.RELEASE_JOB:
        return False
    team_ids = (
        rule.team_ids if hasattr(rule, "team_ids") else frozenset(rule.teams.values_list("pk", flat=True))
    )
    return not team_ids or team_id in team_ids


def _grace_text() -> str:
    grace = settings.IDLE_RELEASE_GRACE_S
    return f"{grace // 60} min" if grace >= 120 else f"{grace} s"


def warning_suffix() -> str:
    return f"; it will be checkpointed and released in {_grace_text()} unless its GPUs get busy"


def warn(alert: Alert) -> None:
    """Step 1: the warning on the job, beside the alert."""
    from apps.jobs.services import job_note

    if alert.job_id is None:
        return
    release_after = alert.started_at + timedelta(seconds=settings.IDLE_RELEASE_GRACE_S)
    job_note(
        alert.job_id,
        f"warning: {alert.message}",
        data={WARNING_MARK: alert.pk, "release_after": release_after.isoformat()},
    )


def called_off(alert: Alert, why: str) -> None:
    """Step 2's other end: the alert of a warned job resolved while the job still runs."""
    if alert.job_id is None:
        return
    warned = JobEvent.objects.filter(job_id=alert.job_id, **{f"data__{WARNING_MARK}": alert.pk}).exists()
    if warned and Job.objects.filter(pk=alert.job_id, state__in=Job.HOLDING_STATES).exists():
        from apps.jobs.services import job_note

        job_note(alert.job_id, f"idle release called off: {why or 'the condition cleared'}")


def release_due(now: Any = None) -> int:
    """Steps 3 and 4 for every warned job whose grace is over and whose alert is still open. Returns how many
    jobs were asked to checkpoint (or, not started yet, released)."""
    from apps.jobs.services import job_checkpoint_and_release

    now = now or timezone.now()
    due = (
        Alert.objects.exclude(state=Alert.State.RESOLVED)
        .filter(
            rule__action=AlertRule.Action.RELEASE_JOB,
            rule__enabled=True,
            job__isnull=False,
            job__state__in=Job.HOLDING_STATES,
            job__placed_at__lte=F("started_at"),
            started_at__lte=now - timedelta(seconds=settings.IDLE_RELEASE_GRACE_S),
        )
        .select_related("rule")
    )
    asked = 0
    for alert in due:
        if alert.job_id is not None and applies(alert.rule, alert.team_id):
            asked += job_checkpoint_and_release(
                alert.job_id,
                f"{alert.rule.name} since {alert.started_at:%H:%M:%S} UTC, past the "
                f"{_grace_text()} grace period (alert {alert.pk})",
            )
    return asked
