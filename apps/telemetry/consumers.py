"""Websockets: /ws/cluster/ (every GPU you may see, about once a second, plus job, queue and alert events) and
/ws/jobs/<id>/ (one job: state, log lines, progress, its GPUs). Close codes: 4401 not logged in, 4403 no access,
4404 no such job (or not yours), 1013 the channel layer (Redis) is down: try again later."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from redis.exceptions import RedisError

from apps.accounts import access
from apps.accounts.access import Viewer
from apps.telemetry.hub import Outgoing, cancel_task, hub

logger = logging.getLogger(__name__)


class LiveConsumer(AsyncWebsocketConsumer):
    job_id: int | None = None
    viewer: Viewer = access.NOBODY

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except RedisError as exc:
            # The channel layer's server (Redis) failed under the socket (channels reads its messages beside the
            # client's): close it with "try again later", as a refused connect does, instead of a traceback.
            logger.warning("live socket closed: the channel layer is unavailable: %s", exc)
            hub.discard(self)
            sender = getattr(self, "sender", None)
            if sender is not None:
                sender.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.close(code=1013), timeout=5)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.user_id = user.pk
        if not await self.recheck_access(initial=True):
            return
        try:
            # The user's group carries role changes (access_changed): without it a revoked user would keep the
            # socket, so no group, no socket.
            await self.channel_layer.group_add(f"user.{self.user_id}", self.channel_name)
        except Exception as exc:  # noqa: BLE001 - the channel layer's server (Redis) is down: the page retries
            logger.warning("live socket of user %s refused: the channel layer is unavailable: %s", self.user_id, exc)
            await self.close(code=1013)  # try again later
            return
        self.outgoing = Outgoing()
        await self.accept()
        self.sender = asyncio.get_running_loop().create_task(self._send_forever())
        hub.add(self)

    async def disconnect(self, code: int) -> None:
        hub.discard(self)
        await cancel_task(getattr(self, "sender", None))
        if hasattr(self, "user_id"):
            try:
                await self.channel_layer.group_discard(f"user.{self.user_id}", self.channel_name)
            except Exception as exc:  # noqa: BLE001 - Redis down: its group entries expire on their own
                logger.info("could not leave the group of user %s: %s", self.user_id, exc)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data and text_data.strip() == '{"type": "ping"}':
            await self.send(text_data='{"type": "pong"}')

    async def access_changed(self, event: dict[str, Any]) -> None:
        """Sent on the user's group when their roles change: re-check at once, close if access is gone."""
        if not await self.recheck_access():
            hub.discard(self)

    def offer_sample(self, message: dict[str, Any] | str) -> None:
        self.outgoing.offer_sample(message)

    def offer_event(self, message: dict[str, Any]) -> None:
        self.outgoing.offer_event(message)

    @property
    def alive(self) -> bool:
        sender = getattr(self, "sender", None)
        return sender is not None and not sender.done()

    async def _send_forever(self) -> None:
        while True:
            await self.outgoing.ready.wait()
            for message in self.outgoing.take():
                text = message if isinstance(message, str) else json.dumps(message, default=str)
                await self.send(text_data=text)

    async def recheck_access(self, initial: bool = False) -> bool:
        allowed, self.viewer = await self._access()
        if not allowed:
            await self.close(code=self.refusal_code if initial else 4403)
        return allowed

    refusal_code = 4403

    @database_sync_to_async
    def _access(self) -> tuple[bool, Viewer]:
        """May the user still follow this stream, and what of it may they see (apps/accounts/access.py)."""
        from django.contrib.auth import get_user_model

        from apps.jobs.models import Job

        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        viewer = access.viewer(user)
        if self.job_id is not None:
            return access.restrict(Job.objects.filter(pk=self.job_id), user).exists(), viewer
        return viewer.sees_cluster, viewer


class ClusterConsumer(LiveConsumer):
    pass


class JobConsumer(LiveConsumer):
    refusal_code = 4404

    async def connect(self) -> None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        await super().connect()
        if getattr(self, "outgoing", None) is not None:
            snapshot = await self._snapshot()
            self.outgoing.offer_event({"type": "job.state", "job": snapshot})

    @database_sync_to_async
    def _snapshot(self) -> dict[str, Any]:
        from apps.jobs.models import Job
        from apps.jobs.serializers import JobSerializer

        job = Job.objects.select_related("team", "user").prefetch_related("allocations__gpu__host").get(pk=self.job_id)
        return JobSerializer(job).data
