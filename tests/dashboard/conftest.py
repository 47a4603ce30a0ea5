from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.test import Client

from apps.jobs.models import Job, JobAllocation, JobEvent, UsageSegment


@pytest.fixture
def web():
    """A logged-in Django test client for a persona (None: anonymous)."""

    def make(user) -> Client:
        client = Client()
        if user is not None:
            client.force_login(user)
        return client

    return make


def make_job(team, user, *, state: str = Job.State.QUEUED, gpus: int = 1, name: str = "job", **fields: Any) -> Job:
    job = Job.objects.create(name=name, team=team, user=user, gpus=gpus, preset="baseline-fp32",
                             workload={"builtin": "mlp-digits", "params": {}}, time_limit_minutes=60, state=state,
                             **fields)
    JobEvent.objects.create(job=job, to_state=Job.State.QUEUED, reason="submitted")
    return job


def hold(job: Job, gpus: list, start: datetime, end: datetime | None = None) -> None:
    """Give a job GPUs and a usage segment from start to end (None: still holding)."""
    for gpu in gpus:
        JobAllocation.objects.create(job=job, gpu=gpu, released_at=end)
    UsageSegment.objects.create(job=job, team=job.team, user=job.user, gpus=len(gpus), started_at=start,
                                ended_at=end)
