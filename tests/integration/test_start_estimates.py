"""Start estimates end to end: a real console and agent. A job held by its team's quota is told, when it is
submitted, when it will start; it must start within 25 % of its wait from that estimate."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.live import LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"
STEP_S = 0.5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("estimates"), agents={"est-a": "2xL4"})
    try:
        live.start()
        # One GPU of the two, without borrowing the idle one: the second job waits for the team's quota.
        create_team(live.admin(), "it", 1)
        assert live.admin().patch("/api/v1/teams/it/quota/", json={"may_borrow": False}).status_code == 200
        yield live
    finally:
        live.stop()


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _steady(cluster: LiveCluster, steps: int) -> dict:
    workload = {"command": [sys.executable, str(SCRIPTS / "steady_steps.py"), str(STEP_S)]}
    return cluster.submit(gpus=1, max_steps=steps, workload=workload)


def test_a_quota_blocked_job_starts_within_a_quarter_of_its_wait_from_its_estimate(cluster):
    first = _steady(cluster, 160)  # 80 s
    cluster.wait_for(
        lambda: (j := cluster.job(first["id"]))["steps_per_second"] and j["steps_done"] >= 4,
        timeout=120,
        what="the first job to report its step time",
    )
    second = _steady(cluster, 4)
    told = cluster.wait_for(
        lambda: (j := cluster.job(second["id"]))["queue_position"] and j,
        timeout=60,
        what="the second job's first pending note",
    )
    assert told["state"] == "queued" and "quota" in told["pending_reason"], told
    assert told["estimated_start"] is not None, told
    assert 0 <= told["estimate_confidence"] <= 1, told
    started = cluster.wait_state(second["id"], {"running", "succeeded"}, timeout=240)
    submitted, estimate, start = (
        _at(started["created_at"]),
        _at(told["estimated_start"]),
        _at(started["started_at"]),
    )
    wait = start - submitted
    assert wait > 0
    assert abs(estimate - start) <= 0.25 * wait, (
        f"estimated {estimate - submitted:.1f} s after submission, started {wait:.1f} s after; "
        f"note: {told['pending_reason']}"
    )
    assert cluster.wait_state(second["id"], {"succeeded"})["state"] == "succeeded"
