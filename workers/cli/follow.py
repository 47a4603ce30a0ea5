"""Following a job: its log (GET /jobs/{id}/logs/?after=N) and its state changes (GET /jobs/{id}/)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from workers.cli.client import Api
from workers.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, ApiError, CliError, Unreachable
from workers.cli.output import err, state_note

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
MAX_PAGES_PER_POLL = 50  # drain a long backlog quickly, but keep watching the job's state
LOG_DRAIN_S = 30.0  # after the job ends, how long to wait for the rest of its log
RETRY_FOR_S = 300.0  # how long a wait survives the console being unreachable or answering 5xx

# Seams for tests: how gpuctl waits and tells the time.
sleep: Callable[[float], None] = time.sleep
clock: Callable[[], float] = time.monotonic


def job_exit_code(job: dict[str, Any]) -> int:
    """The exit status `gpuctl submit --wait` ends with for a final job."""
    state, code = job.get("state"), job.get("exit_code")
    if state == "succeeded":
        return 0
    if state == "cancelled":
        return EXIT_INTERRUPTED
    if not isinstance(code, int) or code == 0:
        return EXIT_FAILURE
    if code < 0:  # killed by signal -code: the shell's convention
        return min(128 - code, 255)
    return code if code <= 255 else EXIT_FAILURE


class LogStream:
    """Writes a job's log as it grows. `available` turns False when the console has no logs endpoint (404)."""

    def __init__(self, api: Api, job_id: int, stream: TextIO | None = None, after: int = 0) -> None:
        self.api = api
        self.job_id = job_id
        self.stream = stream
        self.offset = after
        self.available = True
        self.complete = False

    def poll(self) -> None:
        """Fetch and write what is new (several pages if there is a backlog)."""
        stream = self.stream or sys.stdout
        for _ in range(MAX_PAGES_PER_POLL):
            try:
                page = self.api.get(f"jobs/{self.job_id}/logs/", after=self.offset)
            except ApiError as exc:
                if exc.status == 404:
                    self.available = False
                    return
                raise
            if not isinstance(page, dict) or not isinstance(page.get("data", ""), str):
                raise CliError(f"unexpected answer from {self.api.endpoint(f'jobs/{self.job_id}/logs/')}")
            data = page.get("data") or ""
            if data:
                stream.write(data)
                stream.flush()
            following = page.get("next")
            self.offset = following if isinstance(following, int) and following >= self.offset else self.offset + len(data)
            self.complete = bool(page.get("complete"))
            if self.complete or not data:
                return


class StateReporter:
    """Prints `[gpuctl] job 12: queued -> placed on node-a:0 (H200)` when the state (or why it waits) changes."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.last: tuple[Any, str] | None = None

    def update(self, job: dict[str, Any]) -> None:
        state = job.get("state")
        note = state_note(job)
        if self.last is not None and self.last[0] == state and (state != "queued" or self.last[1] == note):
            return
        previous = self.last[0] if self.last else None
        arrow = f"{previous} -> {state}" if previous and previous != state else str(state)
        err(f"[gpuctl] job {self.job_id}: {arrow}" + (f": {note}" if note else ""))
        self.last = (state, note)


def fetch_job(api: Api, job_id: int) -> dict[str, Any]:
    try:
        job = api.get(f"jobs/{job_id}/")
    except ApiError as exc:
        if exc.status == 404:
            raise CliError(f"job {job_id} not found (or not visible to you) at {api.url}") from None
        raise
    if not isinstance(job, dict) or "state" not in job:
        raise CliError(f"unexpected answer from {api.endpoint(f'jobs/{job_id}/')}")
    return job


class _Retry:
    """Tolerates a console that is briefly unreachable (restart, deploy) while a long job is followed."""

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self, exc: CliError) -> None:
        transient = isinstance(exc, Unreachable) or (isinstance(exc, ApiError) and exc.transient)
        if not transient:
            raise exc
        now = clock()
        if self.since is None:
            self.since = now
            err(f"[gpuctl] {exc.message}; retrying for up to {RETRY_FOR_S:.0f} s")
        elif now - self.since > RETRY_FOR_S:
            raise exc

    def ok(self) -> None:
        if self.since is not None:
            err("[gpuctl] the console answers again")
        self.since = None


def wait_for_job(
    api: Api, job_id: int, *, interval: float, logs: LogStream | None, report_states: bool = True
) -> dict[str, Any]:
    """Poll until the job is final, streaming its log meanwhile; returns the final job."""
    reporter = StateReporter(job_id) if report_states else None
    retry = _Retry()
    while True:
        try:
            job = fetch_job(api, job_id)
            if reporter:
                reporter.update(job)
            if logs is not None:
                _poll_log(api, logs, job_id)
            retry.ok()
        except CliError as exc:
            retry.failed(exc)
        else:
            if job["state"] in FINAL_STATES:
                if logs is not None:
                    drain_log(logs, interval)
                return job
        sleep(interval)


def _poll_log(api: Api, logs: LogStream, job_id: int) -> None:
    """A log that cannot be read does not end the wait: the job's state and exit code matter most."""
    if not logs.available:
        return
    try:
        logs.poll()
    except ApiError as exc:
        if exc.transient:
            raise
        logs.available = False
        err(f"[gpuctl] cannot read the job's log ({exc.message}); following its state only")
        return
    if not logs.available:
        err(f"[gpuctl] {api.url} does not serve job logs (GET .../jobs/{job_id}/logs/ answered 404); "
            "following the job's state only")


def drain_log(logs: LogStream, interval: float) -> None:
    """After the job ended: read until the console says the log is complete (bounded)."""
    deadline = clock() + LOG_DRAIN_S
    while logs.available and not logs.complete and clock() < deadline:
        sleep(interval)
        try:
            logs.poll()
        except (Unreachable, ApiError):
            return


def follow_log(api: Api, job_id: int, *, interval: float, follow: bool, stream: TextIO | None = None) -> None:
    """`gpuctl logs`: print the log so far, and with `follow` keep printing until it is complete."""
    logs = LogStream(api, job_id, stream)
    retry = _Retry()
    while True:
        try:
            logs.poll()
            retry.ok()
        except CliError as exc:
            if not follow:
                raise
            retry.failed(exc)
        if not logs.available:
            fetch_job(api, job_id)  # a missing job says so; otherwise it is the endpoint that is missing
            raise CliError(f"{api.url} does not serve job logs yet (GET {api.endpoint(f'jobs/{job_id}/logs/')} "
                           "answered 404)")
        if not follow or logs.complete:
            return
        sleep(interval)
