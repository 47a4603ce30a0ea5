"""The live hub of one ASGI process: once a second it reads what changed and offers it to this process's sockets.

Each cluster frame has an entry for every GPU the viewer may see, live or marked stale (freshness.py: a host
down or silent for a heartbeat timeout), the hosts with their status, and the counters of both, which add up.

Telemetry frames come from the cache (written by ingest, in whichever process), job events, log chunks and alerts
from the database by id (an outbox read), so the hub works the same with the embedded defaults and with Redis and
several ASGI processes: no event needs to cross processes through the channel layer. Each socket keeps only the
newest telemetry frame and a bounded queue of events, so a slow client gets the latest values, not a backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.db.models import Count, Q

from apps.accounts.access import Viewer, visible_gpu, visible_queue
from apps.telemetry.freshness import cluster_view, gpu_status, host_facts

logger = logging.getLogger(__name__)
TICK_S = 1.0
RECHECK_EVERY_TICKS = 10
GPU_STATUSES = ("busy", "idle", "stale", "down")
EVENT_QUEUE = 200


class Subscriber(Protocol):
    viewer: Viewer  # what it may see (apps/accounts/access.py decides)
    job_id: int | None  # None: the cluster stream

    alive: bool

    def offer_sample(self, message: dict[str, Any] | str) -> None: ...
    def offer_event(self, message: dict[str, Any]) -> None: ...
    async def recheck_access(self) -> bool: ...


ALERT_LOOKBACK = timedelta(seconds=30)

@dataclass
class Outbox:
    last_event: int = 0
    last_log: int = 0
    last_alert: int = 0
    alerts_checked_at: Any = None
    # (alert id, state) already sent: the lookback below sees a change more than once.
    alert_states_sent: set[tuple[int, str]] = field(default_factory=set)


@dataclass
class Hub:
    subscribers: set[Any] = field(default_factory=set)
    task: asyncio.Task | None = None
    outbox: Outbox = field(default_factory=Outbox)
    ticks: int = 0
    progress_sent: dict[int, tuple] = field(default_factory=dict)

    def add(self, subscriber: Any) -> None:
        self.subscribers.add(subscriber)
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._run())

    def discard(self, subscriber: Any) -> None:
        self.subscribers.discard(subscriber)

    async def _run(self) -> None:
        await sync_to_async(self._start_outbox)()
        while self.subscribers:
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - one bad tick must not end the live stream
                logger.exception("live hub tick failed")
            await asyncio.sleep(max(0.05, TICK_S - (time.monotonic() - started)))
        self.task = None

    def _start_outbox(self) -> None:
        from django.utils import timezone

        from apps.jobs.models import JobEvent, JobLogChunk
        from apps.telemetry.models import Alert

        self.outbox = Outbox(
            last_event=JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0,
            last_log=JobLogChunk.objects.order_by("-id").values_list("id", flat=True).first() or 0,
            last_alert=Alert.objects.order_by("-id").values_list("id", flat=True).first() or 0,
            alerts_checked_at=timezone.now(),
        )

    async def tick(self) -> None:
        self.ticks += 1
        from apps.telemetry.services import frame_key

        # The hosts' states and heartbeats every tick: a silent host's GPUs turn stale within the timeout.
        hosts = await sync_to_async(host_facts)()
        keys = {frame_key(host.name): host.name for host in hosts}
        frames = {keys[key]: frame for key, frame in (await cache.aget_many(list(keys))).items()}
        now = time.time()
        view = cluster_view(hosts, frames, now)
        samples = view.gpus
        for subscriber in [s for s in self.subscribers if not s.alive]:
            self.discard(subscriber)  # its sender ended (the socket broke without a disconnect)
        cluster = [s for s in self.subscribers if s.job_id is None]
        # Sockets that may see the same things get the same frame: built and encoded once per group.
        encoded: dict[tuple[bool, frozenset[str]], str] = {}
        for subscriber in cluster:
            key = subscriber.viewer.audience
            if key not in encoded:
                gpus = [visible_gpu(g, subscriber.viewer) for g in samples]
                counts = Counter(gpu_status(g) for g in gpus)
                encoded[key] = json.dumps({
                    "type": "gpu.sample", "ts": now, "gpus": gpus, "hosts": view.hosts,
                    "counts": {"hosts": view.host_counts(),
                               "gpus": {status: counts.get(status, 0) for status in GPU_STATUSES}},
                }, default=str)
            subscriber.offer_sample(encoded[key])
        watched = {s.job_id for s in self.subscribers if s.job_id is not None}
        for subscriber in self.subscribers:
            if subscriber.job_id is not None:
                mine = [visible_gpu(g, subscriber.viewer) for g in samples
                        if any(j["job"] == subscriber.job_id for j in g.get("jobs", []))]
                subscriber.offer_sample({"type": "gpu.sample", "ts": now, "gpus": mine})
        changes = await sync_to_async(self._read_outbox)(watched, bool(cluster))
        self._deliver(changes)
        if self.ticks % RECHECK_EVERY_TICKS == 0:
            for subscriber in list(self.subscribers):
                if not await subscriber.recheck_access():
                    self.discard(subscriber)

    def _read_outbox(self, watched: set[int], cluster_listening: bool) -> dict[str, Any]:
        from django.utils import timezone

        from apps.jobs.models import Job, JobEvent, JobLogChunk
        from apps.jobs.serializers import JobSerializer
        from apps.telemetry.models import Alert
        from apps.telemetry.serializers import AlertSerializer

        box = self.outbox
        events = list(JobEvent.objects.filter(id__gt=box.last_event).order_by("id")
                      .values_list("id", "job_id")[:1000])
        if events:
            box.last_event = events[-1][0]
        changed_jobs = {job_id for _, job_id in events}
        details = {}
        if changed_jobs & watched:
            for job in Job.objects.filter(pk__in=changed_jobs & watched).select_related("team", "user") \
                    .prefetch_related("allocations__gpu__host"):
                details[job.pk] = JobSerializer(job).data
        compact = {}
        if cluster_listening and changed_jobs:
            compact = {job_id: {"id": job_id, "state": state, "team": team, "pending_reason": reason}
                       for job_id, state, team, reason in Job.objects.filter(pk__in=changed_jobs)
                       .values_list("pk", "state", "team__slug", "pending_reason")}
        logs = []
        last_log = JobLogChunk.objects.order_by("-id").values_list("id", flat=True).first() or box.last_log
        if watched and last_log > box.last_log:
            logs = list(JobLogChunk.objects.filter(id__gt=box.last_log, id__lte=last_log, job_id__in=watched)
                        .order_by("id").values("job_id", "offset", "data"))
        box.last_log = last_log
        progress = {}
        for job_id, steps, loss, sps, samples, last_sps, at in Job.objects.filter(pk__in=watched).values_list(
                "pk", "steps_done", "last_loss", "steps_per_second", "samples_per_second", "last_steps_per_second",
                "progress_at"):
            key = (steps, loss, sps, at)
            if at is not None and self.progress_sent.get(job_id) != key:
                self.progress_sent[job_id] = key
                progress[job_id] = {"type": "job.progress", "step": steps, "loss": loss, "steps_per_s": sps,
                                    "samples_per_s": samples, "last_steps_per_s": last_sps, "ts": at.timestamp()}
        alerts = []
        # A change's time is taken before its transaction commits (in another process): looking back
        # ALERT_LOOKBACK catches one that committed after an earlier check had passed its time.
        since = (box.alerts_checked_at or timezone.now()) - ALERT_LOOKBACK
        box.alerts_checked_at = timezone.now()
        new_or_changed = Alert.objects.select_related("rule", "host", "gpu", "team", "acknowledged_by").filter(
            Q(id__gt=box.last_alert) | Q(resolved_at__gte=since) | Q(acknowledged_at__gte=since))
        for alert in new_or_changed.order_by("id")[:200]:
            box.last_alert = max(box.last_alert, alert.pk)
            if (alert.pk, alert.state) in box.alert_states_sent:
                continue
            box.alert_states_sent.add((alert.pk, alert.state))
            alerts.append((alert.team.slug if alert.team else None, AlertSerializer(alert).data))
        if len(box.alert_states_sent) > 10_000:  # only the lookback's changes need remembering
            box.alert_states_sent.clear()
        queue = {}
        if cluster_listening and (events or self.ticks % 5 == 0):
            queue = dict(Job.objects.filter(state=Job.State.QUEUED).values_list("team__slug")
                         .annotate(n=Count("id")))
        return {"details": details, "compact": compact, "logs": logs, "progress": progress, "alerts": alerts,
                "queue": queue}

    def _deliver(self, changes: dict[str, Any]) -> None:
        for subscriber in self.subscribers:
            viewer = subscriber.viewer
            if subscriber.job_id is None:
                for job in changes["compact"].values():
                    if viewer.sees_team(job["team"]):
                        subscriber.offer_event({"type": "job.state", "job": job})
                if changes["queue"]:
                    subscriber.offer_event({"type": "queue", "teams": visible_queue(changes["queue"], viewer)})
            else:
                detail = changes["details"].get(subscriber.job_id)
                if detail is not None:
                    subscriber.offer_event({"type": "job.state", "job": detail})
                for chunk in changes["logs"]:
                    if chunk["job_id"] == subscriber.job_id:
                        subscriber.offer_event({"type": "job.log", "offset": chunk["offset"], "data": chunk["data"]})
                if subscriber.job_id in changes["progress"]:
                    subscriber.offer_event(changes["progress"][subscriber.job_id])
            for team, alert in changes["alerts"]:
                if viewer.sees(team) and (subscriber.job_id is None or alert["job"] in (None, subscriber.job_id)):
                    subscriber.offer_event({"type": "alert", "alert": alert})


hub = Hub()


class Outgoing:
    """What one socket still has to send: the newest telemetry frame, and a bounded queue of events."""

    def __init__(self) -> None:
        self.sample: dict[str, Any] | str | None = None
        self.events: deque[dict[str, Any]] = deque()
        self.overflowed = False
        self.ready = asyncio.Event()

    def offer_sample(self, message: dict[str, Any] | str) -> None:
        self.sample = message  # replaces an unsent older frame: latest values, never a backlog
        self.ready.set()

    def offer_event(self, message: dict[str, Any]) -> None:
        if len(self.events) >= EVENT_QUEUE:
            self.events.clear()
            self.overflowed = True
        self.events.append(message)
        self.ready.set()

    def take(self) -> list[dict[str, Any] | str]:
        batch: list[dict[str, Any] | str] = []
        if self.overflowed:
            batch.append({"type": "resync", "reason": "too slow: events were dropped; reload from the API"})
            self.overflowed = False
        batch.extend(self.events)
        self.events.clear()
        if self.sample is not None:
            batch.append(self.sample)
            self.sample = None
        self.ready.clear()
        return batch


async def cancel_task(task: asyncio.Task | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
