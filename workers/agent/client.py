"""The agent's HTTP client for the console's agent API (authenticated by the host token)."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from workers.protocol import JobSecrets, JobStatus, ProtocolError, Registration, job_secrets_path

logger = logging.getLogger("workers.agent")


class ConsoleRejected(Exception):
    """The console refused a report (409): the job moved on, or the report is from an older attempt."""


class AgentConfigError(Exception):
    """The console refuses this agent (bad token, protocol mismatch): retrying will not help."""


# Tries of a progress post, 0.5 s apart (a connection the server closed as it was reused). Past them the caller
# keeps the records in the job's progress file and sends them on its next tick (each second, from a thread of the
# job's own: runner.JobRunner._forward_progress).
PROGRESS_ATTEMPTS = 2


def transient(exc: Exception) -> bool:
    """Whether a failed post may succeed if sent again: the console unreachable, or its own error (5xx)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return isinstance(exc, httpx.TransportError)


class ConsoleClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 10.0, transport: Any = None) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1/agent/",
            headers={"Authorization": f"Host {token}", "User-Agent": "gpu-console-agent"},
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        response = self._http.post(path, json=payload)
        if response.status_code == 401:
            raise AgentConfigError("the console does not accept this host token (issue a new one)")
        if response.status_code == 409:
            raise ConsoleRejected(response.json().get("detail", "rejected"))
        if response.status_code == 400:
            raise AgentConfigError(f"the console rejected {path}: {response.text[:500]}")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def _post_retrying(self, path: str, payload: dict[str, Any], *, attempts: int) -> dict[str, Any]:
        delay = 0.5
        for attempt in range(attempts):
            try:
                return self._post(path, payload)
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                if attempt == attempts - 1:
                    raise
                logger.warning("console unreachable for %s (%s); retrying in %.1f s", path, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def register(self, registration: Registration) -> dict[str, Any]:
        try:
            return self._post("register/", registration.to_message())
        except ConsoleRejected as exc:
            raise AgentConfigError(str(exc)) from None

    def heartbeat(self, running: list[tuple[int, int]]) -> dict[str, Any]:
        return self._post("heartbeat/", {"running": [list(pair) for pair in running]})

    def report(self, job_id: int, status: JobStatus, *, attempts: int = 30) -> dict[str, Any]:
        return self._post_retrying(f"jobs/{job_id}/status/", status.to_message(), attempts=attempts)

    def log(self, job_id: int, attempt: int, data: str, offset: int, stream: str) -> None:
        """One post of a job's output, `offset` characters into what its LogSender `stream` sent for the attempt
        (it tries again while the console does not answer; the offset lets the console store a resent chunk once)."""
        self._post(f"jobs/{job_id}/logs/", {"attempt": attempt, "data": data, "offset": offset, "stream": stream})

    def telemetry(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self._post("telemetry/", batch)

    def progress(self, job_id: int, attempt: int, progress: dict[str, Any]) -> None:
        self._post_retrying(f"jobs/{job_id}/progress/", {"attempt": attempt, "progress": progress},
                            attempts=PROGRESS_ATTEMPTS)

    def progress_records(self, job_id: int, attempt: int, records: list[dict[str, Any]]) -> None:
        """Training records in the order the job wrote them (the console keeps them as the job's metrics)."""
        self._post_retrying(f"jobs/{job_id}/progress/", {"attempt": attempt, "records": records},
                            attempts=PROGRESS_ATTEMPTS)

    def job_secrets(self, job_id: int, attempt: int, *, attempts: int = 5) -> dict[str, str]:
        """The values of the job's team secrets, for its attempt `attempt` on this host (never in the dispatch).
        ConsoleRejected: the console refuses (the attempt is not this host's, or not placed or running any
        more, or a secret is gone); its words are the reason."""
        delay = 0.5
        for attempt_no in range(attempts):
            try:
                response = self._http.get(job_secrets_path(job_id), params={"attempt": attempt})
                if response.status_code == 401:
                    raise AgentConfigError("the console does not accept this host token (issue a new one)")
                if response.status_code in (400, 404, 409):
                    raise ConsoleRejected(_detail(response))
                response.raise_for_status()
                secrets = JobSecrets.from_message(response.json())
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                if attempt_no == attempts - 1:
                    raise
                logger.warning("console unreachable for job %s's secrets (%s); retrying in %.1f s", job_id, exc,
                               delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            except ValueError as exc:  # not JSON, or not JobSecrets (ProtocolError is a ValueError)
                raise ConsoleRejected(f"the console's answer is not the job's secrets: {exc}") from None
            if secrets.attempt != attempt:
                raise ProtocolError(f"secrets for attempt {secrets.attempt}, asked for {attempt}")
            return secrets.values
        raise AssertionError("unreachable")


def _detail(response: httpx.Response) -> str:
    """The refusal's words: DRF's `detail`, or the fields InvalidInput names."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:500]
    return str(body)[:500]
