"""The values of a job attempt's team secrets, fetched from the console just before the job starts (they are never
in the dispatch): a container gets them in its variables, a process job under a uid of its own in its
environment. The job's output is masked of them (masking.py)."""

from __future__ import annotations

import httpx

from workers.agent.client import AgentConfigError, ConsoleClient, ConsoleRejected
from workers.protocol import Dispatch, ProtocolError


class SecretsError(Exception):
    """The secrets could not be fetched; the text is the job's failure reason."""


def fetch(client: ConsoleClient, dispatch: Dispatch) -> dict[str, str]:
    """The values of the secrets the dispatch names (none: {}). SecretsError if the console refuses or cannot be
    reached, or leaves one out."""
    names = dispatch.container.secrets
    if not names:
        return {}
    try:
        values = client.job_secrets(dispatch.job_id, dispatch.attempt)
    except (ConsoleRejected, AgentConfigError, ProtocolError, httpx.HTTPError) as exc:
        raise SecretsError(f"could not fetch the job's secrets: {exc}") from None
    missing = sorted(set(names) - set(values))
    if missing:
        raise SecretsError(f"could not fetch the job's secrets: the console sent none for {', '.join(missing)}")
    return {name: values[name] for name in names}
