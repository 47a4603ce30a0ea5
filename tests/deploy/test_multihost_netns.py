"""Beyond one machine: a console and two GPU agents on separate network hosts (Linux network namespaces).

A 4-GPU DDP job spans both agent hosts (one torchrun per host, c10d rendezvous over the namespace network); then a
long 4-GPU job loses one host's link mid-run: the host is marked down within the liveness window and the job is
requeued per its restart policy; the link comes back, heartbeats resume and the host is up again.
See tests/deploy/netns.py for the topology. Needs root and iproute2 (`ip netns`).
"""

from __future__ import annotations

import re
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.deploy.netns import AGENTS, NetnsCluster, unavailable_reason
from tests.integration.live import create_team
from workers.protocol import HEARTBEAT_TIMEOUT_S

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]
SHOW_ENV = Path(__file__).resolve().parents[1] / "integration" / "scripts" / "show_env.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    live = NetnsCluster(tmp_path_factory.mktemp("netns"))
    try:
        live.start()
        admin = live.admin()
        create_team(admin, "netns", 8)
        yield live
    finally:
        live.stop()


def proc_lines(log: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in re.findall(r"proc pid=.*", log)]


def test_agents_register_with_their_namespace_addresses(cluster):
    print(f"database: {cluster.database}")
    hosts = {h["name"]: h for h in cluster.admin().get("/api/v1/hosts/").json()["results"]}
    assert set(hosts) == set(AGENTS)
    for name, address in AGENTS.items():
        assert hosts[name]["state"] == "up"
        if "address" in hosts[name]:
            assert hosts[name]["address"] == address
        assert len(hosts[name]["gpus"]) == 2


def test_four_gpu_ddp_job_spans_both_hosts_over_the_network(cluster):
    job = cluster.submit(gpus=4, gpu_type="H200", preset="ddp",
                         workload={"command": ["python", str(SHOW_ENV)]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=120)
    log = cluster.log(job["id"])
    assert done["state"] == "succeeded", log
    assert {a["host"] for a in done["allocations"]} == set(AGENTS)
    procs = proc_lines(log)
    assert sorted(p["rank"] for p in procs) == ["0", "1", "2", "3"], log
    assert {p["world"] for p in procs} == {"4"}
    # One torchrun per host, meeting at node rank 0's namespace address (ns-gpu1 sorts first among equals).
    for name in AGENTS:
        line = re.search(rf"\[agent\] job {job['id']} attempt 1 on {name} GPUs 0,1: .*--rdzv-backend c10d.*", log)
        assert line, log
        assert f"--rdzv-endpoint {AGENTS['ns-gpu1']}:" in line.group(0)
        print(line.group(0))


def test_builtin_ddp_training_spans_both_hosts(cluster):
    job = cluster.submit(gpus=4, gpu_type="H200", preset="ddp", max_steps=6,
                         workload={"builtin": "mlp-digits", "params": {"epochs": 1, "batch_size": 32}})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=150)
    assert done["state"] == "succeeded", cluster.log(job["id"])
    assert done["steps_done"] == 6 and done["exit_code"] == 0
    assert {a["host"] for a in done["allocations"]} == set(AGENTS)


def test_cut_link_marks_the_host_down_requeues_the_job_and_restoring_it_brings_the_host_back(cluster):
    job = cluster.submit(gpus=4, gpu_type="H200", preset="ddp", max_retries=1,
                         workload={"command": [sys.executable, str(SHOW_ENV), "600"]})
    cluster.wait_for(lambda: len(proc_lines(cluster.log(job["id"]))) == 4, timeout=90,
                     what="the four processes of the job to start on both hosts")
    assert cluster.job(job["id"])["state"] == "running"

    cluster.topology.cut("ns-gpu2")
    cut_at = time.monotonic()
    # Timeouts here only mean "never": down ~30 s after the last heartbeat, the reaper looking every 2 s.
    cluster.wait_for(lambda: cluster.host_states().get("ns-gpu2") == "down", timeout=HEARTBEAT_TIMEOUT_S * 4,
                     what="ns-gpu2 to be marked down")
    down_after = time.monotonic() - cut_at
    requeued = cluster.wait_state(job["id"], {"queued", "failed"}, timeout=60)
    requeued_after = time.monotonic() - cut_at
    print(f"link cut: ns-gpu2 down after {down_after:.1f} s, job {job['id']} {requeued['state']} after "
          f"{requeued_after:.1f} s")
    # Marked down no sooner than the heartbeat timeout after its last heartbeat, by the times the console
    # recorded: the host's last heartbeat, and the start of the alert that marking it down raised.
    admin = cluster.admin()
    host = next(h for h in admin.get("/api/v1/hosts/").json()["results"] if h["name"] == "ns-gpu2")
    lost = next(a for a in admin.get("/api/v1/alerts/").json()["results"] if "ns-gpu2 missed heartbeats" in a["message"])
    silence = (datetime.fromisoformat(lost["started_at"]) - datetime.fromisoformat(host["last_heartbeat"])).total_seconds()
    assert silence >= HEARTBEAT_TIMEOUT_S, (host, lost)
    assert requeued["state"] == "queued"
    events = cluster.admin().get(f"/api/v1/jobs/{job['id']}/events/").json()["results"]
    reasons = [e["reason"] for e in events if e["to_state"] == "queued"]
    assert any(r.startswith("host lost: ns-gpu2") and "retry 1 of 1" in r for r in reasons), events
    assert cluster.host_states()["ns-gpu1"] == "up"

    cluster.topology.restore("ns-gpu2")
    restored_at = time.monotonic()
    cluster.wait_for(lambda: cluster.host_states().get("ns-gpu2") == "up", timeout=90,
                     what="ns-gpu2 to come back up once its heartbeats resume")
    up_after = time.monotonic() - restored_at
    print(f"link restored: ns-gpu2 up after {up_after:.1f} s")
    # Both hosts up again: the requeued job is placed anew on both and starts its second attempt.
    again = cluster.wait_for(lambda: (j := cluster.job(job["id"]))["state"] == "running" and j["attempts"] == 2 and j,
                             timeout=180, what="the requeued job to run again on both hosts")
    assert {a["host"] for a in again["allocations"]} == set(AGENTS)
    assert cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/").status_code in (200, 202)
    cluster.wait_state(job["id"], {"cancelled"}, timeout=30)
