"""Defragmentation end to end: a real console and two agents. A 2-GPU gang that the free GPUs hold only in number
(one free on each host of two) moves a running job of another team to the other host: the job checkpoints, is
queued again, resumes from its checkpoint beside the gang's host, and the gang runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.integration.live import LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable
# Long enough never to finish on its own during the test, however fast the machine.
LONG = {"builtin": "mlp-digits", "params": {"epochs": 10_000, "batch_size": 32}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("defrag"), agents={"df-a": "2xL4", "df-b": "2xL4"})
    try:
        live.start()
        create_team(live.admin(), "df", 2)
        create_team(live.admin(), "dg", 4)
        yield live
    finally:
        live.stop()


def _hosts(cluster: LiveCluster, job_id: int) -> set[str]:
    return {a["host"] for a in cluster.job(job_id)["allocations"]}


def test_a_gang_moves_another_teams_job_off_the_host_it_needs(cluster):
    short = cluster.submit(team="dg", gpus=1, workload={"command": [PY, str(SCRIPTS / "show_env.py"), "3"]})
    # Of a higher class than the gang: they come before it in the order (defrag.py moves only such jobs), whatever
    # their predicted run times.
    first = cluster.submit(team="dg", gpus=1, priority="high", max_steps=100_000, workload=LONG)
    cluster.wait_state(first["id"], {"running"})
    second = cluster.submit(team="dg", gpus=1, priority="high", max_steps=100_000, workload=LONG)
    cluster.wait_state(second["id"], {"running"})
    assert cluster.wait_state(short["id"], {"succeeded", "failed"})["state"] == "succeeded"
    # One job on each host now, one GPU free on each: no host of two for a 2-GPU gang.
    assert _hosts(cluster, first["id"]) != _hosts(cluster, second["id"]), cluster.board()
    for job in (first, second):
        cluster.wait_for(lambda job=job: cluster.job(job["id"])["steps_done"] >= 20, timeout=90,
                         what=f"job {job['id']} to train")
    gang = cluster.submit(team="df", gpus=2, workload={"command": [PY, str(SCRIPTS / "show_env.py"), "2"]})
    assert cluster.wait_state(gang["id"], {"succeeded", "failed"}, timeout=180)["state"] == "succeeded"
    reasons = {job["id"]: [e["reason"] for e in cluster.admin().get(f"/api/v1/jobs/{job['id']}/events/").json()[
        "results"]] for job in (first, second)}
    moved = [job_id for job_id, said in reasons.items()
             if any(r.startswith("preemption requested") and f"make room for job {gang['id']}" in r for r in said)]
    assert len(moved) == 1, reasons
    moved_id = moved[0]
    assert any(r.startswith("preempted on ") for r in reasons[moved_id]), reasons
    resumed = cluster.wait_for(
        lambda: re.search(r"resumed from \S+ \(step (\d+)", cluster.log(moved_id)), timeout=120,
        what="the moved job to resume from its checkpoint")
    assert int(resumed.group(1)) >= 20
    assert cluster.wait_state(moved_id, {"running"})["state"] == "running"
    # A move is no preemption of the job's (its protection and borrowing stay as they were).
    assert [cluster.job(job["id"])["preemption_count"] for job in (first, second)] == [0, 0]
    for job in (first, second):
        cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})
        cluster.wait_state(job["id"], {"cancelled"})
