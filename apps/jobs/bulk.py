"""Cancel several jobs at once (the jobs page's "Cancel selected", POST /api/v1/jobs/cancel/).

Each job goes through `job_cancel`, which asks apps/accounts/access.py; a refusal of one job is reported with the
answer its error carries (403 not allowed, 409 already ended) and never stops the others. A job the user may not
see is reported as not found, as one that does not exist (no existence leak).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest

from apps.accounts import access
from apps.core.errors import DomainError
from apps.jobs.lifecycle import job_cancel
from apps.jobs.models import Job

# The most jobs one request cancels (a page of the jobs table holds 50; the API's largest page 500).
MAX_BULK_CANCEL = 500
NOT_FOUND = "No such job."


@dataclass(frozen=True)
class CancelOutcome:
    id: int
    cancelled: bool
    status: int  # 200 cancelled; else the refusal's HTTP answer (404, 403, 409)
    detail: str
    name: str | None = None  # None for a job the user may not see
    state: str | None = None  # the job's state after the attempt

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "cancelled": self.cancelled, "status": self.status, "detail": self.detail,
                "state": self.state}


def jobs_cancel(*, ids: list[int], actor: Any, reason: str = "", request: HttpRequest | None = None
                ) -> list[CancelOutcome]:
    """Cancel each job of `ids` (in that order, each once) the actor may cancel; one outcome per id."""
    wanted = list(dict.fromkeys(ids))
    visible = access.restrict(Job.objects.select_related("team", "user").filter(pk__in=wanted), actor).in_bulk()
    outcomes = []
    for job_id in wanted:
        job = visible.get(job_id)
        if job is None:
            outcomes.append(CancelOutcome(job_id, False, 404, NOT_FOUND))
            continue
        try:
            done = job_cancel(job=job, actor=actor, reason=reason, request=request)
        except DomainError as exc:  # refused: access (403) or already ended (409), as its error says
            job.refresh_from_db(fields=["state"])
            outcomes.append(CancelOutcome(job_id, False, exc.status, str(exc), job.name, job.state))
        else:
            outcomes.append(CancelOutcome(job_id, True, 200, "cancelled", done.name, done.state))
    return outcomes
