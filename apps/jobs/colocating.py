"""Shareable jobs sharing one GPU (measured-utilization packing): the console's side of apps/scheduling/colocation.

The decisions are the core's; this module keeps what they are made from and carries them out, each change in one
transaction under the jobs' and the GPU's row locks:

- `record_steps`: from a shareable job's progress records, its step times alone and while paired (the tallies its
  measured slowdown comes from);
- `pair`: a queued shareable job joins a running one on its GPU, each then holding half of it;
- `split`: the guest of a pair that hurts is requeued at its next checkpoint, and the two never pair again;
- `unpair`: once one of a pair no longer holds the GPU, the other grows back to the whole GPU.

`Job.colocation` holds, as JSON:
  measured   {"utilization_pct", "samples", "memory_mb"}: the job measured alone (its GPU's telemetry)
  alone, paired  [reports, summed step seconds]: its step times alone and while sharing
  windows    [[from, until or null], ...]: epoch seconds it shared its GPU
  last_ts    the newest progress record's time
  state      "paired" (shares now), "ended" (its neighbour left), "split" (split for its slowdown)
  role, with, host, gpu_index, reason, predicted_slowdown: the latest pairing
  slowdown   step time while paired / step time alone (null until both are measured)
  avoid      jobs it is never paired with again
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.cluster.models import GPU
from apps.jobs.lifecycle import job_preempt, lock_job, note
from apps.jobs.models import Job, JobAllocation, UsageSegment
from apps.jobs.placement import job_place
from apps.scheduling.colocation import PAIR_UNITS, measured_slowdown
from apps.scheduling.sharing import FULL
from workers.protocol import RESHARE_JOB_TASK, TrainingProgress, host_queue

logger = logging.getLogger(__name__)
State = Job.State


def _mean(tally: Any) -> float | None:
    return tally[1] / tally[0] if isinstance(tally, list) and len(tally) == 2 and tally[0] else None


def slowdown_of(colocation: dict[str, Any]) -> float | None:
    """The job's measured slowdown from its tallies (None until it ran both alone and paired)."""
    value = measured_slowdown(_mean(colocation.get("alone")), _mean(colocation.get("paired")))
    return round(value, 3) if value is not None else None


def paired_reports(colocation: dict[str, Any]) -> int:
    tally = colocation.get("paired")
    return int(tally[0]) if isinstance(tally, list) and tally else 0


# A sharing window: [from, until] in epoch seconds, until None while the job shares.
Window = Sequence[Any]


def _overlaps(start: float, end: float, windows: Sequence[Window]) -> bool:
    return any(start < (until if until is not None else float("inf")) and end > since for since, until in windows)


def _inside(start: float, end: float, windows: Sequence[Window]) -> bool:
    return any(start >= since and (until is None or end <= until) for since, until in windows)


def record_steps(job: Job, records: Sequence[TrainingProgress]) -> None:
    """Add a (locked) shareable job's new progress records to its step-time tallies: a record whose interval lies
    inside a window it shared its GPU counts as paired, one outside all of them as alone, one across an edge not
    at all. The first record of an attempt has no interval start and is left out."""
    colocation = dict(job.colocation or {})
    windows = colocation.get("windows", [])
    last_ts = colocation.get("last_ts")
    alone = list(colocation.get("alone", [0, 0.0]))
    paired = list(colocation.get("paired", [0, 0.0]))
    for record in records:
        if record.ts is None:
            continue
        if last_ts is not None and record.ts > last_ts and record.steps_per_s:
            if _inside(last_ts, record.ts, windows):
                paired = [paired[0] + 1, paired[1] + 1.0 / record.steps_per_s]
            elif not _overlaps(last_ts, record.ts, windows):
                alone = [alone[0] + 1, alone[1] + 1.0 / record.steps_per_s]
        last_ts = record.ts if last_ts is None else max(last_ts, record.ts)
    colocation.update(alone=alone, paired=paired, last_ts=last_ts)
    colocation["slowdown"] = slowdown_of(colocation)
    Job.objects.filter(pk=job.pk).update(colocation=colocation)
    job.colocation = colocation


def _send_reshare_after_commit(job_id: int, attempt: int, host_name: str, share: float) -> None:
    def send() -> None:
        from celery import current_app

        try:
            current_app.send_task(RESHARE_JOB_TASK, args=[job_id, attempt, share], queue=host_queue(host_name))
        except Exception:  # noqa: BLE001 - the watch then keeps the old share; the placement checks still hold
            logger.warning("could not tell host %s the new share of job %s", host_name, job_id, exc_info=True)

    transaction.on_commit(send)


def _resize(job: Job, allocation: JobAllocation, units: int, now: Any) -> None:
    """Give a holding job `units` of its one GPU: its allocation, its row, its usage ledger (the open segment ends
    and a new one starts at the new share), and its agent's memory watch."""
    JobAllocation.objects.filter(pk=allocation.pk).update(share_units=units)
    host = GPU.objects.filter(pk=allocation.gpu_id).values_list("host__name", flat=True).first()
    if host:
        _send_reshare_after_commit(job.pk, job.attempts, host, units / FULL)
    Job.objects.filter(pk=job.pk).update(gpu_share_units=units)
    UsageSegment.objects.filter(job=job, ended_at__isnull=True).update(ended_at=now)
    UsageSegment.objects.create(job=job, team_id=job.team_id, user_id=job.user_id, gpus=1, share_units=units,
                                started_at=now)


def pair(resident_id: int, guest_id: int, gpu_id: int, *, reason: str, predicted_slowdown: float,
         measured: dict[int, dict[str, Any]] | None = None) -> bool:
    """Place queued `guest_id` beside running `resident_id` on its GPU, half of it each. False (nothing changed)
    when anything no longer holds: the resident no longer runs alone on it, the guest is no longer waiting, or the
    placement's own checks (quota, GPU health, memory) refuse."""
    with transaction.atomic():
        gpu = GPU.objects.select_for_update().select_related("host").filter(pk=gpu_id).first()
        resident = lock_job(resident_id)
        guest = lock_job(guest_id)
        if gpu is None or resident is None or guest is None:
            return False
        if resident.state != State.RUNNING or resident.preempt_requested_at or not resident.shareable:
            return False
        if guest.state != State.QUEUED or not guest.shareable or guest.gpus != 1 or guest.is_fractional:
            return False
        held = list(JobAllocation.objects.filter(gpu=gpu, released_at__isnull=True))
        if len(held) != 1 or held[0].job_id != resident.pk or held[0].share_units != FULL:
            return False
        now = timezone.now()
        _resize(resident, held[0], PAIR_UNITS, now)
        Job.objects.filter(pk=guest.pk).update(gpu_share_units=PAIR_UNITS)
        where = f"GPU {gpu.index} of host {gpu.host.name}"
        if not job_place(guest.pk, (gpu.pk,), reason=f"placed beside job {resident.pk} to share its GPU ({reason})",
                         share_units=PAIR_UNITS):
            transaction.set_rollback(True)
            return False
        epoch = now.timestamp()
        for job, other, role in ((resident, guest, "resident"), (guest, resident, "guest")):
            colocation = dict(job.colocation or {})
            if measured and job.pk in measured:
                colocation["measured"] = measured[job.pk]
            colocation.update(state="paired", role=role, host=gpu.host.name, gpu_index=gpu.index, gpu=gpu.uuid,
                              reason=reason, predicted_slowdown=round(predicted_slowdown, 3), **{"with": other.pk})
            colocation["windows"] = [*colocation.get("windows", []), [epoch, None]]
            Job.objects.filter(pk=job.pk).update(colocation=colocation)
        note(resident, f"sharing {where} with job {guest.pk}: {reason}; now holds half of it",
             data={"colocation": {"with": guest.pk, "predicted_slowdown": round(predicted_slowdown, 3)}})
        logger.info("job %s joins job %s on %s: %s", guest.pk, resident.pk, where, reason)
        return True


def _close_window(colocation: dict[str, Any], at: float) -> None:
    windows = [list(w) for w in colocation.get("windows", [])]
    if windows and windows[-1][1] is None:
        windows[-1][1] = at
    colocation["windows"] = windows


def split(guest_id: int, resident_id: int, *, reason: str) -> bool:
    """Split a pair that hurts: the guest checkpoints and goes back to the queue (a whole-GPU job again), the
    resident grows back once the guest's share is released (`unpair`), and neither is paired with the other again."""
    with transaction.atomic():
        guest, resident = lock_job(guest_id), lock_job(resident_id)
        if guest is None or resident is None or (guest.colocation or {}).get("state") != "paired":
            return False
        for job, other in ((guest, resident), (resident, guest)):
            colocation = dict(job.colocation or {})
            colocation["avoid"] = sorted({*colocation.get("avoid", []), other.pk})
            colocation["state"] = "split"
            colocation["split_reason"] = reason
            Job.objects.filter(pk=job.pk).update(colocation=colocation)
        # Its next run asks for the whole GPU again (a job asked to stop is out of the scheduler's snapshot).
        Job.objects.filter(pk=guest.pk).update(gpu_share_units=FULL)
        note(resident, f"split from job {guest.pk}: {reason}")
    return job_preempt(guest_id, f"split from job {resident_id} on its shared GPU: {reason}")


def pair_over(job: Job) -> bool:
    """Whether a pairing of `job` has ended: it or its neighbour no longer holds the shared GPU."""
    colocation = job.colocation or {}
    held = JobAllocation.objects.filter(gpu__uuid=colocation.get("gpu"), released_at__isnull=True,
                                        job_id__in=[job.pk, colocation.get("with")]).count()
    return held < 2


def unpair(job_id: int) -> bool:
    """End a pairing that is over (`pair_over`): its sharing window closes when the first of the two left the GPU
    and, if the job still runs there and nothing else does, it holds the whole GPU again."""
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or (job.colocation or {}).get("state") not in ("paired", "split") or not pair_over(job):
            return False
        colocation = dict(job.colocation)
        releases = JobAllocation.objects.filter(
            gpu__uuid=colocation.get("gpu"), job_id__in=[job.pk, colocation.get("with")],
            released_at__gte=_window_start(colocation)).values_list("released_at", flat=True)
        at = min((r.timestamp() for r in releases if r is not None), default=time.time())
        _close_window(colocation, at)
        if colocation["state"] == "paired":
            colocation["state"] = "ended"
        elif colocation["state"] == "split":
            colocation["state"] = "was-split"
        Job.objects.filter(pk=job.pk).update(colocation=colocation)
        if job.state == State.QUEUED and job.gpu_share_units != FULL:
            # Requeued (preempted, its host lost) while it shared: its next run asks for its whole GPU again.
            Job.objects.filter(pk=job.pk).update(gpu_share_units=FULL)
        if job.state in Job.HOLDING_STATES and job.preempt_requested_at is None:
            held = list(JobAllocation.objects.filter(job=job, released_at__isnull=True))
            if len(held) == 1 and held[0].share_units < FULL:
                GPU.objects.select_for_update().filter(pk=held[0].gpu_id).first()
                if not JobAllocation.objects.filter(gpu_id=held[0].gpu_id, released_at__isnull=True).exclude(
                        job=job).exists():
                    _resize(job, held[0], FULL, timezone.now())
                    note(job, f"job {colocation.get('with')} left its GPU: it holds the whole GPU again")
        return True


def _window_start(colocation: dict[str, Any]) -> datetime:
    windows = colocation.get("windows") or [[0.0, None]]
    return datetime.fromtimestamp(windows[-1][0] - 5.0, tz=UTC)


def sharing_text(job: Job) -> str:
    """Why the job shares (or shared) its GPU, for its page and its API record; empty if it never did."""
    colocation = job.colocation or {}
    if "with" not in colocation:
        return ""
    where = f"GPU {colocation.get('gpu_index')} of host {colocation.get('host')}"
    slowdown = colocation.get("slowdown")
    measured = (f"slowdown measured {slowdown:.2f}×" if slowdown is not None
                else f"slowdown not measured yet (predicted {colocation.get('predicted_slowdown', 1.0):.2f}×)")
    state = str(colocation.get("state"))
    verb = {"paired": "sharing", "ended": "shared", "split": "split from sharing",
            "was-split": "split from sharing"}.get(state, "shared")
    text = f"{verb} {where} with job {colocation['with']}: {colocation.get('reason', '')}; {measured}"
    if state in ("split", "was-split") and colocation.get("split_reason"):
        text += f"; split: {colocation['split_reason']}"
    return text


def sharing_data(job: Job) -> dict[str, Any] | None:
    """The job's pairing for its API record (None: it never shared)."""
    colocation = job.colocation or {}
    if "with" not in colocation:
        return None
    return {
        "state": colocation.get("state"), "with": colocation.get("with"), "role": colocation.get("role"),
        "host": colocation.get("host"), "gpu_index": colocation.get("gpu_index"),
        "reason": colocation.get("reason"), "predicted_slowdown": colocation.get("predicted_slowdown"),
        "alone_step_s": _mean(colocation.get("alone")), "paired_step_s": _mean(colocation.get("paired")),
        "paired_reports": paired_reports(colocation), "why": sharing_text(job),
    }
