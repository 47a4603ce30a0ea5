"""A cancelled receive on the Redis channel layer ends (apps/telemetry/channel_layer.py): a websocket consumer is
cancelled this way every time its socket closes. Needs Redis (REDIS_URL): CI's PostgreSQL + Redis pass runs it."""

from __future__ import annotations

import asyncio
import random

import pytest
from channels.layers import get_channel_layer
from django.conf import settings

from apps.telemetry.channel_layer import RedisChannelLayer

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: set REDIS_URL=redis://…")

TRIES = 50  # before the fix, one to four in 100 cancelled receives never ended (after it: one BZPOPMIN at most)
BRPOP_TIMEOUT_S = 1  # channels_redis' is 5 s: a third of the cancels wait out one, and 50 of them took 40 s


def test_every_cancelled_receive_ends():
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    rng = random.Random(7)

    async def run() -> list[int]:
        hung = []
        for attempt in range(TRIES):
            channel = await layer.new_channel()
            receive = asyncio.ensure_future(layer.receive(channel))
            await asyncio.sleep(rng.random() * 0.02)  # the cancel lands anywhere in the receive loop
            receive.cancel()
            # A receive still running after 30 s, many BZPOPMINs later, would never have ended.
            done, _ = await asyncio.wait({receive}, timeout=30)
            if not done:
                hung.append(attempt)
                return hung
            assert receive.cancelled(), receive
        return hung

    async def round_trip() -> dict:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "ping"})
        return await asyncio.wait_for(layer.receive(channel), timeout=30)

    # Not asyncio.run: its shutdown would wait on a receive that never ends, and the test would hang, not fail.
    loop = asyncio.new_event_loop()
    layer.brpop_timeout = BRPOP_TIMEOUT_S  # an instance attribute over the class's, removed again below
    try:
        assert loop.run_until_complete(run()) == []
        # A message sent after those cancels still reaches a receiver.
        assert loop.run_until_complete(round_trip()) == {"type": "ping"}
    finally:
        del layer.brpop_timeout
        loop.close()
