"""A job's output on its way to the console, sent from a thread of its own so that the job never waits for it.

The thread that reads a job's output hands each batch to the job's LogSender and goes back to reading. While the
console does not answer, the batches wait here, up to `max_pending_chars`; output past that is counted, not kept,
and the console is told how much it missed. They are sent in order when it answers again. Each chunk carries its
offset in the stream (workers.protocol.unseen_output), so a post whose answer was lost after the console stored it,
sent again, is stored once. A refusal (the attempt moved on) ends the sending. The agent's local output.log and the
job's log artifact keep everything whatever happens here.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable

from workers.agent.client import ConsoleRejected, transient

logger = logging.getLogger("workers.agent")

CHUNK_CHARS = 256 * 1024  # at most this much in one post
MAX_PENDING_CHARS = 8 * 1024 * 1024  # kept while the console does not answer; past it, output is counted
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0


class LogSender:
    def __init__(self, send: Callable[[int, str, str], object], *, name: str,
                 max_pending_chars: int = MAX_PENDING_CHARS, chunk_chars: int = CHUNK_CHARS) -> None:
        self._send = send
        self.name = name
        self._max_pending = max_pending_chars
        self._chunk = chunk_chars
        self._pending: deque[str] = deque()
        self._pending_chars = 0
        self.stream = secrets.token_hex(8)  # this sender's output, apart from an earlier run's of the same attempt
        self._offset = 0  # characters of the stream sent (or refused) before the next chunk
        self._missed = 0  # characters not kept since the last ones that were
        self._changed = threading.Condition()
        self._closing = False
        self._refused = False
        self._abandoned = threading.Event()
        self._wake = threading.Event()  # closing: the next try comes now, not after the backoff
        self.delivered_at = time.monotonic()  # when the console last took a chunk (or the sender started)
        self._thread = threading.Thread(target=self._serve, name=f"log-{name}", daemon=True)
        self._thread.start()

    def put(self, text: str) -> None:
        """Queue output for the console; never blocks on it."""
        if not text:
            return
        with self._changed:
            if self._refused or self._closing:
                return
            if self._pending_chars + len(text) > self._max_pending:
                self._missed += len(text)
                return
            self._append(self._missed_note() + text)
            self._changed.notify()

    def close(self, idle_s: float) -> bool:
        """Send what is queued, waiting while the console takes it; give up after `idle_s` without a chunk taken
        (the console down). True when everything was sent, or refused because the attempt moved on."""
        with self._changed:
            if self._missed and not self._refused:
                self._append(self._missed_note())
            self._closing = True
            self._changed.notify()
        self._wake.set()
        closed_at = time.monotonic()
        while self._thread.is_alive():
            left = max(self.delivered_at, closed_at) + idle_s - time.monotonic()
            if left <= 0:
                break
            self._thread.join(min(left, 1.0))
        if not self._thread.is_alive():
            return True
        self._abandoned.set()
        self._wake.set()
        with self._changed:
            unsent, self._pending = self._pending_chars, deque()
            self._pending_chars = 0
            self._changed.notify()
        logger.warning("%s: %d characters of output not sent to the console, which did not answer for %.0f s "
                       "(the job's log artifact keeps them)", self.name, unsent, idle_s)
        return False

    def _append(self, text: str) -> None:
        self._pending.append(text)
        self._pending_chars += len(text)

    def _missed_note(self) -> str:
        if not self._missed:
            return ""
        note = (f"\n[agent] {self._missed} characters of output were not sent here (the console did not take "
                "them); the job's log artifact keeps them\n")
        self._missed = 0
        return note

    def _take(self) -> str | None:
        """The next chunk, or None once closed and empty (called with the condition held)."""
        while not self._pending and not self._closing:
            self._changed.wait()
        if not self._pending:
            return None
        parts: list[str] = []
        size = 0
        while self._pending and size < self._chunk:
            part = self._pending.popleft()
            if size + len(part) > self._chunk:
                part, rest = part[: self._chunk - size], part[self._chunk - size:]
                self._pending.appendleft(rest)
            parts.append(part)
            size += len(part)
        self._pending_chars -= size
        return "".join(parts)

    def _serve(self) -> None:
        delay = RETRY_FIRST_S
        while not self._abandoned.is_set():
            with self._changed:
                chunk = self._take()
            if chunk is None:
                return
            try:
                self._send(self._offset, chunk, self.stream)
            except ConsoleRejected as exc:  # the job moved on (cancelled or requeued): its output is not its record's
                logger.info("%s: the console takes no more of its output: %s", self.name, exc)
                with self._changed:
                    self._refused = True
                    self._pending.clear()
                    self._pending_chars = 0
                return
            except Exception as exc:  # noqa: BLE001 - the local log keeps everything
                if not transient(exc):
                    logger.warning("%s: the console refused a log chunk: %s", self.name, exc)
                    self._offset += len(chunk)  # the next chunk starts after it: the console takes it whole
                    with self._changed:  # said in the log like output past the bound
                        self._missed += len(chunk)
                        if self._closing:  # (no put is left to carry the note)
                            self._append(self._missed_note())
                    continue
                logger.warning("%s: log not sent (%s); again in %.1f s", self.name, exc, delay)
                with self._changed:  # first in line again, and counted: the bound holds what waits
                    self._pending.appendleft(chunk)
                    self._pending_chars += len(chunk)
                if self._wake.wait(delay):
                    self._wake.clear()
                    delay = RETRY_FIRST_S
                else:
                    delay = min(delay * 2, RETRY_MAX_S)
                continue
            self._offset += len(chunk)
            self.delivered_at = time.monotonic()
            delay = RETRY_FIRST_S
