"""Fair share, attained service, budgets, reports and the simulator count a fractional job's GPU-seconds alike.

One job holds a quarter of a GPU for 4 hours: 0.25 x 14,400 s = 3,600 GPU-seconds = 1 GPU-hour, in every
consumer, each called through its own entry point (a whole-GPU count would say 4 GPU-hours).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from apps.dashboard.reports import usage_report
from apps.jobs.models import Job, UsageSegment
from apps.jobs.scheduler import build_snapshot, policy_config
from apps.quotas.models import TeamQuota
from apps.quotas.selectors import budget_exhausted, gpu_seconds_between, team_usage
from apps.scheduling.config import PolicyConfig
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import TraceJob, build_hosts
from apps.scheduling.types import Decisions, Placement, Snapshot, TeamQuotaView
from tests.dashboard.conftest import make_job

SHARE_UNITS = 25
RUN_S = 4 * 3600.0
EXPECTED_GPU_S = 3600.0
START = datetime(2026, 10, 10, 10, tzinfo=UTC)
END = START + timedelta(seconds=RUN_S)
# So long that decay changes the figures by under 1e-5 (fair share weighs each second by 2^-(age / half-life)).
HALF_LIFE_S = 1e9


@pytest.fixture
def quarter_job(world) -> Job:
    """A quarter-GPU job that ran 4 hours, was preempted and waits again (so it has attained service)."""
    job = make_job(world.vision, world.member, state=Job.State.QUEUED, gpu_share_units=SHARE_UNITS, name="quarter")
    UsageSegment.objects.create(job=job, team=job.team, user=job.user, gpus=1, share_units=SHARE_UNITS,
                                started_at=START, ended_at=END)
    return job


def test_fair_share_and_attained_service(quarter_job):
    config = replace(policy_config(), usage_half_life_s=HALF_LIFE_S)
    snapshot = build_snapshot(now=END.timestamp(), config=config)
    vision = snapshot.quotas["vision"]
    assert vision.recent_usage_gpu_seconds == pytest.approx(EXPECTED_GPU_S, rel=1e-5)
    assert vision.user_recent_usage_gpu_seconds["mia"] == pytest.approx(EXPECTED_GPU_S, rel=1e-5)
    (pending,) = snapshot.pending
    assert pending.attained_gpu_seconds == pytest.approx(EXPECTED_GPU_S)


def test_budget(world, quarter_job):
    assert gpu_seconds_between(world.vision, START - timedelta(hours=1), END + timedelta(hours=1)) == pytest.approx(
        EXPECTED_GPU_S)
    TeamQuota.objects.filter(team=world.vision).update(gpu_hours_per_month=Decimal("1.5"))
    usage = team_usage(world.vision, now=END + timedelta(hours=1))
    assert usage.gpu_hours_this_month == pytest.approx(1.0)
    assert usage.gpu_hours_left == pytest.approx(0.5)
    quota = TeamQuota.objects.get(team=world.vision)
    assert not budget_exhausted(world.vision, quota, now=END + timedelta(hours=1))
    quota.gpu_hours_per_month = Decimal("1.0")
    assert budget_exhausted(world.vision, quota, now=END + timedelta(hours=1))


def test_report(world, quarter_job):
    report = usage_report([world.vision], datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC),
                          costs={}, now=END + timedelta(hours=1))
    assert report.total.allocated == pytest.approx(EXPECTED_GPU_S / 3600)
    (row,) = report.jobs
    assert (row.job_id, row.allocated) == (quarter_job.pk, pytest.approx(1.0))


def test_simulator():
    """The same job in the simulator: busy time, attained service and (decayed) fair-share usage."""
    job = TraceJob(job_id=1, gpus=1, submit_s=0.0, duration_s=RUN_S, model="m", team="vision", user="mia")
    quotas = {"vision": TeamQuotaView("vision", 1, may_borrow=True), "nlp": TeamQuotaView("nlp", 1, may_borrow=True)}

    def quarter_gpu(snapshot: Snapshot) -> Decisions:
        return Decisions(tuple(Placement(p.job_id, (0,), gpu_share=SHARE_UNITS / 100) for p in snapshot.pending))

    sim = Simulator([job], build_hosts(1, 2), quarter_gpu, quotas, config=PolicyConfig(usage_half_life_s=HALF_LIFE_S))
    result = sim.run("quarter")
    (state,) = result.jobs
    assert state.finish == pytest.approx(RUN_S)
    assert result.busy_gpu_s == pytest.approx(EXPECTED_GPU_S)
    assert state.attained_gpu_s == pytest.approx(EXPECTED_GPU_S)
    assert result.teams["vision"].recent_usage_gpu_seconds == pytest.approx(EXPECTED_GPU_S, rel=1e-5)
    assert result.teams["vision"].user_recent_usage_gpu_seconds["mia"] == pytest.approx(EXPECTED_GPU_S, rel=1e-5)
