"""Fractional GPUs on simulated GPUs: four quarter-GPU jobs share one GPU, the quota counts them as one GPU,
telemetry shows each job's memory, and a job past its memory share is stopped while its neighbour runs on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from websockets.sync.client import connect

from tests.integration.live import LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("fractional"), agents={"fr-a": "2xH100"})
    try:
        live.start()
        admin = live.admin()
        create_team(admin, "share", 2)
        yield live
    finally:
        live.stop()


def submit(cluster, **spec) -> dict:
    response = cluster.admin().post("/api/v1/jobs/", json={"team": "share", "name": "frac", **spec})
    assert response.status_code == 201, response.text
    return response.json()


def test_bad_fractional_specs(cluster):
    admin = cluster.admin()
    for spec, field in [({"gpus": 1.5}, "gpus"), ({"gpus": 2, "gpu_memory_gb": 10}, "gpu_memory_gb"),
                        ({"gpus": 1, "gpu_memory_gb": 500}, "gpu_memory_gb"), ({"gpus": 0}, "gpus")]:
        response = admin.post("/api/v1/jobs/", json={"team": "share", "name": "x",
                                                     "workload": {"builtin": "mlp-digits"}, **spec})
        assert response.status_code == 400 and field in response.json(), response.text


def test_four_quarters_share_one_gpu_and_count_as_one(cluster):
    sleeper = {"command": [PY, str(SCRIPTS / "show_env.py"), "40"]}
    quarters = [submit(cluster, gpus=0.25, workload=sleeper) for _ in range(4)]
    for job in quarters:
        cluster.wait_state(job["id"], {"running"})
    details = [cluster.job(job["id"]) for job in quarters]
    assert {d["gpus"] for d in details} == {0.25}
    assert len({d["allocations"][0]["uuid"] for d in details}) == 1  # all four on the same GPU
    assert {d["allocations"][0]["share"] for d in details} == {0.25}
    assert {d["runtime_info"].get("gpu_share") for d in details} == {"watch"}  # simulated: the memory watch
    assert cluster.admin().get("/api/v1/teams/share/usage/").json()["gpus_held"] == 1.0
    fifth = submit(cluster, gpus=0.25, workload=sleeper)
    placed = cluster.wait_state(fifth["id"], {"running"})
    assert placed["allocations"][0]["uuid"] != details[0]["allocations"][0]["uuid"]  # a GPU of its own
    assert cluster.admin().get("/api/v1/teams/share/usage/").json()["gpus_held"] == 1.25

    # Telemetry: the shared GPU's frame lists each job with its share and the memory its processes use.
    url = cluster.ws_url(f"/ws/jobs/{quarters[0]['id']}/", cluster.admin())
    with connect(url, open_timeout=30) as socket:
        for _ in range(20):
            message = json.loads(socket.recv(timeout=30))
            if message["type"] == "gpu.sample" and message["gpus"]:
                jobs = message["gpus"][0]["jobs"]
                if len(jobs) == 4 and all(j["memory_mb"] for j in jobs):
                    break
        else:
            pytest.fail("no frame with the four jobs' memory")
    assert {j["job"] for j in jobs} == {q["id"] for q in quarters} and {j["share"] for j in jobs} == {0.25}
    for job in [*quarters, fifth]:
        cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})


def test_a_job_past_its_memory_share_is_stopped_and_its_neighbour_keeps_running(cluster):
    neighbour = submit(cluster, gpus=1, gpu_memory_gb=4,
                       workload={"command": [PY, str(SCRIPTS / "hold_memory.py"), "50", "60"]})
    greedy = submit(cluster, gpus=1, gpu_memory_gb=1,
                    workload={"command": [PY, str(SCRIPTS / "hold_memory.py"), "1500", "60"]})
    cluster.wait_state(neighbour["id"], {"running"})
    stopped = cluster.wait_state(greedy["id"], {"failed"}, timeout=60)
    assert "over its share of 1024 MiB" in stopped["failure_reason"], stopped["failure_reason"]
    same_gpu = cluster.job(neighbour["id"])["allocations"][0]["uuid"] == stopped["allocations"][0]["uuid"]
    assert same_gpu
    assert cluster.job(neighbour["id"])["state"] == "running"
    cluster.admin().post(f"/api/v1/jobs/{neighbour['id']}/cancel/", json={})
