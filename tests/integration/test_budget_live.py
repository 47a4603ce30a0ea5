"""A monthly GPU-hour budget that runs out while jobs wait stops their placements, on a live console.

One agent with one simulated GPU; a team with a budget of 0.01 GPU-hours (36 GPU-seconds) and a quota of one GPU
runs a 45-second job while two more wait for the GPU. The running job finishes (the default policy) past the
budget; the waiting ones are never placed and say why, until an admin raises the budget.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.live import LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("budget"), agents={"bud-a": "1xH200"})
    try:
        live.start()
        yield live
    finally:
        live.stop()


def test_a_budget_spent_mid_queue_stops_placements(cluster):
    admin = cluster.admin()
    create_team(admin, "bud", 1)
    assert admin.patch("/api/v1/teams/bud/quota/", json={"gpu_hours_per_month": "0.01"}).status_code == 200
    command = {"command": [sys.executable, str(SCRIPTS / "show_env.py"), "45"]}
    first = cluster.submit(team="bud", gpus=1, workload=command)
    waiting = [cluster.submit(team="bud", gpus=1, workload=command) for _ in range(2)]  # within budget: accepted
    done = cluster.wait_state(first["id"], {"succeeded", "failed"}, timeout=240)
    assert done["state"] == "succeeded"  # running jobs finish past the budget (when_budget_spent: finish)
    for job in waiting:
        cluster.wait_for(lambda job=job: "monthly GPU-hour budget" in cluster.job(job["id"])["pending_reason"],
                         timeout=60, what=f"job {job['id']} to wait for the budget")
    usage = admin.get("/api/v1/teams/bud/usage/").json()
    assert usage["budget_spent"] and usage["gpu_hours_over"] > 0 and usage["budget_used_pct"] > 100
    for job in waiting:
        record = cluster.job(job["id"])
        assert record["state"] == "queued" and record["attempts"] == 0 and record["estimated_start"] is None
    # The budget was the only thing in the way: raised, the queue moves again.
    assert admin.patch("/api/v1/teams/bud/quota/", json={"gpu_hours_per_month": "10"}).status_code == 200
    cluster.wait_for(lambda: cluster.job(waiting[0]["id"])["state"] in ("placed", "running", "succeeded"),
                     timeout=60, what="the first waiting job to be placed once the budget was raised")
