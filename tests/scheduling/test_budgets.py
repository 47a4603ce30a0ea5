"""A team whose monthly GPU-hour budget is spent gets no placements; with `stop_when_spent` its jobs stop."""

from __future__ import annotations

import pytest

from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.types import TeamQuotaView
from apps.scheduling.usage import budget_overrun_hours, budget_spent
from tests.scheduling.helpers import hosts, pending, running, snapshot


def test_budget_arithmetic():
    assert not budget_spent(10 * 3600.0, 0)  # no budget: unlimited
    assert not budget_spent(9.99 * 3600, 10)
    assert budget_spent(10 * 3600.0, 10)
    assert budget_overrun_hours(12.5 * 3600, 10) == pytest.approx(2.5)
    assert budget_overrun_hours(5 * 3600.0, 10) == 0.0
    assert budget_overrun_hours(5 * 3600.0, 0) == 0.0


def _quotas(spent: bool, stop: bool = False) -> dict[str, TeamQuotaView]:
    return {
        "vision": TeamQuotaView("vision", 8, budget_spent=spent, stop_when_spent=stop),
        "nlp": TeamQuotaView("nlp", 8),
    }


@pytest.mark.parametrize("policy", ["console", "fifo", "fifo-backfill", "fair-share"])
def test_a_spent_budget_stops_placements_with_a_reason(policy):
    snap = snapshot(hosts(1, 4), [pending(1, team="vision"), pending(2, team="nlp")], quotas=_quotas(spent=True))
    decisions = schedule(snap, PolicyConfig(policy=policy))
    assert [p.job_id for p in decisions.placements] == [2]
    info = decisions.pending[1]
    assert info.code == "budget" and "monthly GPU-hour budget" in info.reason
    assert info.estimated_start is None
    assert not decisions.preemptions


def test_within_budget_the_same_job_is_placed():
    snap = snapshot(hosts(1, 4), [pending(1, team="vision")], quotas=_quotas(spent=False))
    assert [p.job_id for p in schedule(snap, PolicyConfig()).placements] == [1]


def test_running_jobs_finish_by_default():
    snap = snapshot(hosts(1, 4), [], [running(5, (0, 1), team="vision")], quotas=_quotas(spent=True))
    assert not schedule(snap, PolicyConfig()).preemptions


def test_stop_when_spent_preempts_the_teams_running_jobs_and_frees_their_gpus():
    snap = snapshot(
        hosts(1, 4),
        [pending(3, gpus=4, team="nlp")],
        [running(5, (0, 1), team="vision", preemptible=False), running(6, (2, 3), team="nlp")],
        quotas=_quotas(spent=True, stop=True),
        now=100.0,
    )
    decisions = schedule(snap, PolicyConfig())
    assert [p.job_id for p in decisions.preemptions] == [5]
    assert "budget" in decisions.preemptions[0].reason
