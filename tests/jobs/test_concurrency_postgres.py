"""50 concurrent submissions and several scheduler passes at once, against PostgreSQL, repeated 20 times.

A monitor samples the database continuously: the team never holds more than its max_gpus in placed+running jobs
and no GPU is ever held by two jobs, at any instant it looks.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from apps.cluster.models import GPU
from apps.jobs import services
from apps.jobs.models import Job, JobAllocation
from apps.jobs.scheduler import build_snapshot, scheduler_pass
from apps.quotas.models import TeamQuota
from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from tests.conftest import train_spec
from tests.factories import HostFactory, MembershipFactory, TeamFactory, UserFactory, add_gpus

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SAMPLE_SQL = """
SELECT
  (SELECT COALESCE(SUM(gpus), 0) FROM jobs_job WHERE team_id = %s AND state IN ('placed', 'running')),
  (SELECT COUNT(*) FROM (SELECT gpu_id FROM jobs_joballocation WHERE released_at IS NULL
                         GROUP BY gpu_id HAVING COUNT(*) > 1) AS doubled),
  (SELECT COUNT(*) FROM jobs_joballocation WHERE released_at IS NULL)
"""


def in_thread(fn):
    def run(*args):
        try:
            return fn(*args)
        finally:
            connections.close_all()

    return run


@pytest.fixture
def cluster(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: set DATABASE_URL=postgres://…")
    team = TeamFactory(slug="vision")
    TeamQuota.objects.filter(team=team).update(max_gpus=8, may_borrow=False)
    users = [UserFactory(username=f"researcher{i}") for i in range(5)]
    for user in users:
        MembershipFactory(team=team, user=user)
    add_gpus(HostFactory(name="node-a"), 8)
    add_gpus(HostFactory(name="node-b"), 8)
    return team, users


@pytest.mark.parametrize("round_no", range(20))
def test_concurrent_submissions_and_passes_never_overbook(cluster, round_no):
    team, users = cluster
    rng = random.Random(round_no)
    stop = threading.Event()
    violations: list[str] = []
    samples = 0

    @in_thread
    def monitor() -> None:
        nonlocal samples
        with connection.cursor() as cursor:
            while not stop.is_set():
                cursor.execute(SAMPLE_SQL, [team.pk])
                held, doubled, _ = cursor.fetchone()
                samples += 1
                if held > 8:
                    violations.append(f"team holds {held} GPUs")
                if doubled:
                    violations.append(f"{doubled} GPUs held twice")

    @in_thread
    def submit(i: int) -> int:
        client = APIClient()
        client.force_authenticate(users[i % len(users)])
        spec = {"name": f"job-{i}", "team": "vision", "gpus": rng.randint(1, 4), "workload": {"builtin": "mlp-digits"}}
        return client.post("/api/v1/jobs/", spec, format="json").status_code

    @in_thread
    def passes() -> int:
        placed = 0
        while not stop.is_set():
            placed += scheduler_pass().placed
        return placed

    @in_thread
    def slow_passes(seed: int) -> None:
        # A pass that decides on a snapshot and applies it a little later, as a slow pass on a busy console would:
        # its decisions are stale by then, and only the locked re-checks in job_place keep the invariants.
        jitter = random.Random(seed)
        while not stop.is_set():
            decisions = schedule(build_snapshot(), PolicyConfig(policy="fifo"))
            time.sleep(jitter.uniform(0, 0.03))
            for placement in decisions.placements:
                services.job_place(placement.job_id, placement.gpu_ids)

    @in_thread
    def rogue_placer(seed: int) -> None:
        # Placements no policy would propose (any queued job on any GPUs that look free): job_place alone must
        # refuse whatever would break the quota or double-book a GPU.
        pick = random.Random(seed)
        while not stop.is_set():
            queued = list(Job.objects.filter(state="queued").values_list("pk", "gpus")[:20])
            if not queued:
                time.sleep(0.005)
                continue
            job_id, gpus = pick.choice(queued)
            busy = set(JobAllocation.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True))
            free = [g for g in GPU.objects.values_list("pk", flat=True) if g not in busy]
            if len(free) >= gpus:
                services.job_place(job_id, tuple(pick.sample(free, gpus)))

    @in_thread
    def finisher() -> None:
        # Jobs end while passes run, so GPUs churn and passes keep competing for them.
        while not stop.is_set():
            placed = list(Job.objects.filter(state="placed").values_list("pk", flat=True)[:2])
            for pk in placed:
                services.job_finish(pk, succeeded=True, exit_code=0, reason="done")
            time.sleep(0.01)

    with ThreadPoolExecutor(max_workers=20) as pool:
        background = [pool.submit(monitor), pool.submit(finisher)]
        background += [pool.submit(passes) for _ in range(2)] + [pool.submit(slow_passes, i) for i in range(2)]
        background += [pool.submit(rogue_placer, i) for i in range(2)]
        statuses = list(pool.map(submit, range(50)))
        time.sleep(0.3)
        stop.set()
        for future in background:
            future.result(timeout=60)

    assert statuses == [201] * 50
    assert samples > 10
    assert violations == []
    held_now = sum(Job.objects.filter(team=team, state__in=["placed", "running"]).values_list("gpus", flat=True))
    assert held_now <= 8
    assert Job.objects.count() == 50


def test_the_submission_rate_limit_holds_under_concurrency_across_teams(transactional_db, settings):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: set DATABASE_URL=postgres://…")
    settings.JOBS_SUBMIT_PER_MINUTE = 6
    user = UserFactory(username="burst")
    teams = [TeamFactory(slug=slug) for slug in ("vision", "speech")]
    for team in teams:
        TeamQuota.objects.filter(team=team).update(max_gpus=8)
        MembershipFactory(team=team, user=user)
    add_gpus(HostFactory(name="node-a"), 8)
    barrier = threading.Barrier(16, timeout=60)  # a thread that fails before it fails the rest, not hangs

    @in_thread
    def submit(number: int) -> int:
        client = APIClient()
        client.force_authenticate(user)
        barrier.wait()
        return client.post("/api/v1/jobs/", train_spec(team=teams[number % 2].slug), format="json").status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(submit, range(16)))
    assert sorted(codes) == [201] * 6 + [429] * 10, codes
    assert Job.objects.filter(user=user).count() == 6
