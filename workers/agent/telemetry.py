"""The agent's telemetry: every GPU sampled once a second and sent as one batch per host; XID errors at once.

A GPU that does not answer is sent as `available: false` (the console shows "no data", never 0 %). Processes on
a GPU are mapped to our jobs through their ancestry: every job runs below its shim, whose pid the runner knows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from workers.agent.gpus import GpuBackend, GpuSample, XidEvent

logger = logging.getLogger("workers.agent")
SAMPLE_INTERVAL_S = 1.0
MAX_ANCESTRY = 64


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[1])


def job_of_pid(pid: int, job_roots: dict[int, int]) -> int | None:
    """The job whose shim `pid` descends from, if any."""
    current: int | None = pid
    for _ in range(MAX_ANCESTRY):
        if current is None or current <= 1:
            return None
        if current in job_roots:
            return job_roots[current]
        current = _parent(current)
    return None


def sample_message(sample: GpuSample, job_roots: dict[int, int]) -> dict[str, Any]:
    message = asdict(sample)
    message["processes"] = [
        {"pid": p.pid, "memory_mb": p.memory_mb, "job": job_of_pid(p.pid, job_roots)} for p in sample.processes
    ]
    return message


def memory_by_job(messages: list[dict[str, Any]]) -> dict[int, int]:
    """GPU memory (MiB) each of our jobs uses, summed over its processes on every GPU."""
    used: dict[int, int] = {}
    for message in messages:
        for process in message["processes"]:
            if process["job"] is not None and process["memory_mb"] is not None:
                used[process["job"]] = used.get(process["job"], 0) + process["memory_mb"]
    return used


def xid_message(event: XidEvent) -> dict[str, Any]:
    return {"index": event.index, "uuid": event.uuid, "xid": event.xid, "ts": event.ts}


class TelemetryLoop:
    def __init__(
        self,
        backend: GpuBackend,
        send: Callable[[dict[str, Any]], Any],
        job_roots: Callable[[], dict[int, int]],
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        on_memory: Callable[[dict[int, int]], None] | None = None,
    ) -> None:
        self.backend = backend
        self.send = send
        self.job_roots = job_roots
        self.interval_s = interval_s
        self.on_memory = on_memory
        self.stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._sample_forever, name="telemetry", daemon=True).start()
        threading.Thread(target=self._xid_forever, name="xid-events", daemon=True).start()

    def _sample_forever(self) -> None:
        next_tick = time.monotonic()
        while not self.stop.is_set():
            try:
                samples = self.backend.sample()
                roots = self.job_roots()
                messages = [sample_message(s, roots) for s in samples]
                if self.on_memory is not None:
                    self.on_memory(memory_by_job(messages))
                self.send({"ts": time.time(), "gpus": messages, "xid": []})
            except Exception as exc:  # noqa: BLE001 - telemetry must never stop the agent
                logger.warning("telemetry batch not sent: %s", exc)
            next_tick += self.interval_s
            # After a slow send, skip the missed ticks rather than bursting to catch up.
            next_tick = max(next_tick, time.monotonic())
            self.stop.wait(max(0.0, next_tick - time.monotonic()))

    def _xid_forever(self) -> None:
        while not self.stop.is_set():
            try:
                events = self.backend.poll_xid_events(1000)
            except Exception as exc:  # noqa: BLE001
                logger.warning("XID events unavailable: %s", exc)
                self.stop.wait(5)
                continue
            if events:
                try:
                    self.send({"ts": time.time(), "gpus": [], "xid": [xid_message(e) for e in events]})
                except Exception as exc:  # noqa: BLE001
                    logger.warning("XID events not sent: %s", exc)
