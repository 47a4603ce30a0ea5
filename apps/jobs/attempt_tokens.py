"""The credential of one job attempt: what a running job presents to the console's job API, and nothing else.

A job never sees its host's token (the agent hands it an allow-listed environment). Instead each attempt gets a
token of its own, signed by the console and sent inside the dispatch (the broker, which jobs cannot read): it names
the job and the attempt, and it is honoured only while that attempt is the job's current one and the job runs. A
requeued job's next attempt gets a new token; the old one stops working with the attempt.

An inference replica's secret is derived the same way, per job and attempt (`replica_secret`, see
apps.serving.replica_auth): it travels in the dispatch, and the serving app computes it again to call the replica.
"""

from __future__ import annotations

from django.core import signing
from django.utils.crypto import salted_hmac

from apps.jobs.models import Job

SALT = "console.jobs.attempt-token"
# The salt it had in apps.serving.replica_auth, where it was first defined: secrets of running replicas still verify.
REPLICA_SECRET_SALT = "apps.serving.replica-secret"


def _signer() -> signing.Signer:
    # No timestamp: a redelivered dispatch carries the same token; its life is the attempt's, checked on use.
    return signing.Signer(salt=SALT)


def attempt_token(job_id: int, attempt: int) -> str:
    return _signer().sign_object({"job": job_id, "attempt": attempt})


def attempt_from_token(token: str, states: tuple[str, ...] = (Job.State.RUNNING,)) -> Job | None:
    """The running job whose current attempt `token` was issued for; None for any other token. `states`: the
    job API's code download also serves an attempt that is placed (its agent fetches the code before it starts)."""
    try:
        claim = _signer().unsign_object(token)
    except (signing.BadSignature, ValueError):
        return None
    if not isinstance(claim, dict) or not isinstance(claim.get("job"), int) or not isinstance(claim.get("attempt"), int):
        return None
    return (Job.objects.select_related("team", "user")
            .filter(pk=claim["job"], attempts=claim["attempt"], state__in=states).first())


def replica_secret(job_id: int, attempt: int) -> str:
    """HMAC of the job id and attempt under SECRET_KEY: no row holds it, and each attempt gets a new one."""
    return salted_hmac(REPLICA_SECRET_SALT, f"{int(job_id)}:{int(attempt)}", algorithm="sha256").hexdigest()
