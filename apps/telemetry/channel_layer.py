"""The Redis channel layer (channels_redis), with a cancelled receive that always ends.

Every websocket consumer receives on its channel with channels_redis' loop of 5-second BZPOPMINs, and is cancelled
when its socket closes. On Python 3.11 a cancel can be lost: redis-py sends each command through `asyncio.wait_for`,
which returns the inner result and drops the outer cancel when both happen at once (CPython bpo-42130, fixed in
3.12). The loop then goes on to its next BZPOPMIN, the task stays "cancelling" forever, and so does the consumer
that awaits it (CI: a refused websocket's consumer hung a test for 20 minutes; a bare receive-and-cancel on loopback
Redis hangs about once in 100 to 600 tries). Here a receive whose task has a cancel pending stops at the end of its
current read, within the 5 seconds of one BZPOPMIN.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer


def _raise_if_cancelling() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("the receive was cancelled while Redis answered")


class RedisChannelLayer(_RedisChannelLayer):  # type: ignore[misc]
    async def _brpop_with_clean(self, index: int, channel: str, timeout: float) -> Any:
        try:
            return await super()._brpop_with_clean(index, channel, timeout)
        finally:
            # Whatever the read ended with (a message, nothing, an error that stands for a cut-short read), a
            # pending cancel wins; a message popped meanwhile stays in its backup queue for the channel's next receive.
            _raise_if_cancelling()
