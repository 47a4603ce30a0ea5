"""The server's parts in-process: input validation and the batcher's queue bound (no HTTP)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from workers.runtime.serve import Batcher, InputError, Overloaded, Payload, _digits_array


class BlockingEngine:
    """Records the batches it is given; blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[int] = []

    def run(self, payloads: list[Payload]) -> list[dict]:
        self.release.wait(10)
        self.batches.append(sum(p.count for p in payloads))
        return [{"outputs": [p.count]} for p in payloads]


def test_batches_fill_up_while_a_forward_pass_runs_and_a_full_queue_answers_503() -> None:
    async def scenario() -> tuple[list, list[int]]:
        engine = BlockingEngine()
        batcher = Batcher(engine, max_batch=8, max_wait_s=0.001, batching=True, max_queue=20)  # type: ignore[arg-type]
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(Payload(1, None)))
        await asyncio.sleep(0.05)  # the first request's forward pass is running (blocked)
        rest = [asyncio.ensure_future(batcher.submit(Payload(1, None))) for _ in range(25)]
        await asyncio.sleep(0.05)
        assert batcher.queued_items == 20
        engine.release.set()
        results = await asyncio.gather(first, *rest, return_exceptions=True)
        await batcher.stop()
        return results, engine.batches

    results, batches = asyncio.run(scenario())
    overloaded = [r for r in results if isinstance(r, Overloaded)]
    assert len(overloaded) == 5 and "queued" in str(overloaded[0])
    assert batches == [1, 8, 8, 4]  # the 20 queued while the first ran: full batches of max_batch


def test_no_batching_takes_one_request_at_a_time() -> None:
    async def scenario() -> list[int]:
        engine = BlockingEngine()
        engine.release.set()
        batcher = Batcher(engine, max_batch=8, max_wait_s=0.01, batching=False, max_queue=100)  # type: ignore[arg-type]
        batcher.start()
        await asyncio.gather(*(batcher.submit(Payload(2, None)) for _ in range(5)))
        await batcher.stop()
        return engine.batches

    assert asyncio.run(scenario()) == [2, 2, 2, 2, 2]


def test_digits_validation() -> None:
    pixels = _digits_array([[16] * 64, [[1.5] * 8] * 8])
    assert pixels.shape == (2, 64) and pixels.dtype == np.float32 and pixels[1, 0] == 1.5
    with pytest.raises(InputError, match=r"inputs\[1\] has 8 rows but not 8 numbers"):
        _digits_array([[0] * 64, [[0] * 8] * 7 + [[0] * 7]])
    with pytest.raises(InputError, match=r"inputs\[0\]\[5\] = -1 is out of range"):
        _digits_array([[0] * 5 + [-1] + [0] * 58])
    with pytest.raises(InputError, match=r"inputs\[0\]\[0\] is null, not a number"):
        _digits_array([[None] + [0] * 63])
