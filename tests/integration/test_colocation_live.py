"""Measured-utilization packing end to end: two shareable jobs that leave a simulated GPU mostly idle end up on
that one GPU, half of it each; the slowdown each shows (step time paired over alone) is recorded on the job, and
its page says why it shares. The jobs' compute phases lock their simulated GPU (scripts/shared_steps.py), so
sharing costs what time-slicing one GPU would."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.integration.live import LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("colocation"), agents={"pk-a": "1xH100"},
                       extra_env={"CONSOLE_COLOCATION_MIN_SAMPLES": "8"})
    try:
        live.start()
        create_team(live.admin(), "pack", 2)
        yield live
    finally:
        live.stop()


def test_two_low_utilization_jobs_share_one_gpu_with_a_measured_slowdown(cluster):
    admin = cluster.admin()

    def submit(name: str) -> dict:
        workload = {"command": [PY, str(SCRIPTS / "shared_steps.py"), "0.03", "0.47", str(cluster.port)]}
        response = admin.post("/api/v1/jobs/", json={"team": "pack", "name": name, "gpus": 1, "shareable": True,
                                                     "workload": workload, "time_limit_minutes": 30})
        assert response.status_code == 201, response.text
        return response.json()

    first = submit("first")
    cluster.wait_state(first["id"], {"running"})
    second = submit("second")  # no GPU free: it waits, then joins the first once that is measured mostly idle
    second = cluster.wait_state(second["id"], {"running"}, timeout=180)
    first = cluster.job(first["id"])
    assert first["allocations"][0]["uuid"] == second["allocations"][0]["uuid"]  # the same simulated GPU
    assert first["allocations"][0]["share"] == second["allocations"][0]["share"] == 0.5
    assert second["runtime_info"].get("gpu_share") == "watch"  # held to half the memory by the agent's watch
    assert first["sharing"]["state"] == "paired" and first["sharing"]["with"] == second["id"]
    assert first["sharing"]["reason"].startswith(f"job {first['id']} measured under 30 % utilization")
    agent_log = cluster.base / "agent-pk-a.log"  # the resident's memory watch now holds it to its half
    cluster.wait_for(lambda: f"job {first['id']}: now holds 0.50 of its GPU" in agent_log.read_text(), timeout=30,
                     what="the agent to watch the first job at half the GPU")

    # The first's slowdown: its steps while paired against its steps alone before.
    first = cluster.wait_for(lambda: (j := cluster.job(first["id"]))["measured_slowdown"] is not None
                             and j["sharing"]["paired_reports"] >= 20 and j, timeout=120,
                             what="the first job's measured slowdown")
    page = cluster.browser().get(f"/jobs/{first['id']}/").text
    assert f"sharing GPU 0 of host pk-a with job {second['id']}: job {first['id']} measured under 30 %" in page
    assert re.search(r"; slowdown measured \d\.\d\d×", page)  # (new steps may have moved it since the API read)

    # The first ends: the second holds the whole GPU again, and its steps alone give its own slowdown.
    admin.post(f"/api/v1/jobs/{first['id']}/cancel/", json={})
    cluster.wait_state(first["id"], {"cancelled"})
    second = cluster.wait_for(lambda: (j := cluster.job(second["id"]))["allocations"][0]["share"] == 1.0 and j,
                              timeout=60, what="the second job to hold the whole GPU again")
    second = cluster.wait_for(lambda: (j := cluster.job(second["id"]))["measured_slowdown"] is not None and j,
                              timeout=120, what="the second job's measured slowdown")
    assert second["sharing"]["state"] == "ended"
    assert "slowdown measured" in cluster.browser().get(f"/jobs/{second['id']}/").text
    admin.post(f"/api/v1/jobs/{second['id']}/cancel/", json={})
    cluster.wait_state(second["id"], {"cancelled"})
    first, second = cluster.job(first["id"]), cluster.job(second["id"])
    print(f"\nfirst: alone {first['sharing']['alone_step_s']:.3f} s/step, paired "
          f"{first['sharing']['paired_step_s']:.3f} s/step, slowdown {first['measured_slowdown']}; "
          f"second: alone {second['sharing']['alone_step_s']:.3f}, paired {second['sharing']['paired_step_s']:.3f}, "
          f"slowdown {second['measured_slowdown']}; why: {first['sharing']['why']}")
    assert 0.8 < first["measured_slowdown"] < 1.5 and 0.8 < second["measured_slowdown"] < 1.5


def test_a_trial_pair_that_hurts_is_split_and_not_formed_again(cluster):
    """A waiting job never measured joins on trial; it turns out to keep the GPU busy (99 % of its step computing),
    the resident's steps slow down past 1.5x, and the guest is preempted back to the queue, never to pair with it
    again; the resident holds its whole GPU again."""
    admin = cluster.admin()

    def submit(name: str, compute_s: str, wait_s: str) -> dict:
        workload = {"command": [PY, str(SCRIPTS / "shared_steps.py"), compute_s, wait_s, str(cluster.port)]}
        response = admin.post("/api/v1/jobs/", json={"team": "pack", "name": name, "gpus": 1, "shareable": True,
                                                     "workload": workload, "time_limit_minutes": 30})
        assert response.status_code == 201, response.text
        return response.json()

    idle = submit("idle", "0.03", "0.47")
    cluster.wait_state(idle["id"], {"running"})
    busy = submit("busy", "1.5", "0.02")
    cluster.wait_for(lambda: cluster.job(busy["id"])["sharing"] is not None, timeout=180,
                     what="the busy job to join the idle one on trial")
    idle = cluster.wait_for(lambda: (j := cluster.job(idle["id"]))["sharing"]["state"] in ("split", "was-split")
                            and j, timeout=180, what="the pair to be split")
    assert idle["measured_slowdown"] > 1.5
    busy = cluster.wait_state(busy["id"], {"queued"}, timeout=60)  # preempted at its checkpoint, requeued
    assert busy["sharing"]["state"] in ("split", "was-split") and busy["preemption_count"] == 1
    events = [e["reason"] for e in admin.get(f"/api/v1/jobs/{busy['id']}/events/").json()["results"]]
    assert any(f"split from job {idle['id']} on its shared GPU: slowdown measured" in e for e in events), events
    cluster.wait_for(lambda: cluster.job(idle["id"])["allocations"][0]["share"] == 1.0, timeout=60,
                     what="the idle job to hold its whole GPU again")
    page = cluster.browser().get(f"/jobs/{idle['id']}/").text
    assert f"split from sharing GPU 0 of host pk-a with job {busy['id']}" in page
    print(f"\nsplit: idle job slowdown {idle['measured_slowdown']} (alone {idle['sharing']['alone_step_s']:.3f} "
          f"s/step, paired {idle['sharing']['paired_step_s']:.3f}); {idle['sharing']['why']}")
    for job in (idle, busy):
        admin.post(f"/api/v1/jobs/{job['id']}/cancel/", json={})
