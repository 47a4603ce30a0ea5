"""What the console needs to reach an inference replica, and nothing else: its secret and its URL.

The secret is derived, not stored: HMAC of the job id and attempt under SECRET_KEY (Django's salted_hmac, with a
salt of its own), computed in apps.jobs.attempt_tokens, which the dispatch uses too. So there is no row for a job or an API to read it from, no migration, every attempt of a replica
gets a new one (a secret seen by an earlier attempt's host does not open the next one), and the dispatch, the
reconciler and the gateway all compute the same value without sharing anything but the settings.

A replica's URL is built here only, from the address its host registered (validated at registration) and the
port the replica reported; anything else (a record claiming another host, a port that is not 1..65535) is refused.
"""

from __future__ import annotations

import ipaddress

from apps.jobs.attempt_tokens import REPLICA_SECRET_SALT as SALT
from apps.jobs.attempt_tokens import replica_secret
from workers.protocol import REPLICA_SECRET_HEADER, valid_address

__all__ = ["SALT", "replica_headers", "replica_secret", "replica_url"]


def replica_headers(job_id: int, attempt: int) -> dict[str, str]:
    return {REPLICA_SECRET_HEADER: replica_secret(job_id, attempt)}


def replica_url(address: object, port: object) -> str:
    """http://ADDRESS:PORT for a registered host address and a reported port; ValueError for anything else."""
    if not isinstance(address, str) or not valid_address(address):
        raise ValueError(f"not a registered host address: {address!r}")
    if type(port) is not int or not 0 < port < 65536:
        raise ValueError(f"not a port: {port!r}")
    try:
        literal = ipaddress.ip_address(address)
    except ValueError:
        literal = None
    host = f"[{address}]" if literal is not None and literal.version == 6 else address
    return f"http://{host}:{port}"
