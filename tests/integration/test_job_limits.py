"""Job limits end to end: a real console and agent; the job runs in its own cgroup with the spec's cpus and memory_gb.

Needs a writable cgroup hierarchy (root, on v1 or v2): elsewhere the agent runs jobs without limits and says so in
runtime_info, which the first test checks before skipping the rest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.live import LiveCluster, create_team
from workers.agent.cgroups import CgroupSupport

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable
AGENT = "limits-a"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    live = LiveCluster(tmp_path_factory.mktemp("limits"), agents={AGENT: "2xL4"})
    try:
        live.start()
        create_team(live.admin(), "it", 4)
        yield live
    finally:
        live.stop()


def _limits_or_skip(job: dict) -> dict:
    limits = job["runtime_info"].get("limits")
    assert limits is not None, job["runtime_info"]
    if not limits["applied"]:
        assert limits["reason"]
        pytest.skip(f"the agent applies no cgroup limits here: {limits['reason']}")
    return limits


def _job_cgroup_folders(cluster: LiveCluster, job: dict) -> list[Path]:
    support = CgroupSupport(parent=cluster.env["GPU_AGENT_CGROUP_PARENT"])
    return [folder / f"job-{job['id']}-1" for folder in support.host_dirs(AGENT).values()]


def _wait_cgroup_removed(cluster: LiveCluster, job: dict) -> None:
    """The agent reports a job's end first and removes its cgroup after (the kernel may keep it busy a while)."""
    folders = _job_cgroup_folders(cluster, job)
    cluster.wait_for(lambda: not any(folder.exists() for folder in folders), timeout=60,
                     what=f"the cgroup of job {job['id']} to be removed: {folders}")


def test_a_job_past_its_memory_limit_fails_as_out_of_memory(cluster):
    job = cluster.submit(gpus=1, memory_gb=0.25, workload={"command": [PY, str(SCRIPTS / "hold_memory.py"), "1024", "1"]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    limits = _limits_or_skip(done)
    assert limits["memory_gb"] == 0.25 and limits["cgroup"] in ("v1", "v2")
    log = cluster.log(job["id"])
    assert done["state"] == "failed", log
    assert done["failure_reason"] == "out of memory: the job exceeded its memory limit of 0.25 GB", log
    assert done["exit_code"] == 137
    assert "holding 1024 MiB" not in log
    _wait_cgroup_removed(cluster, done)


def test_a_job_within_tiny_limits_succeeds(cluster):
    job = cluster.submit(gpus=0.5, cpus=0.5, memory_gb=0.5,
                         workload={"command": [PY, str(SCRIPTS / "hold_memory.py"), "64", "0"]})
    assert (job["cpus"], job["memory_gb"]) == (0.5, 0.5)
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    limits = _limits_or_skip(done)
    assert done["state"] == "succeeded", cluster.log(job["id"])
    assert {key: limits[key] for key in ("cpus", "memory_gb", "pids")} == {"cpus": 0.5, "memory_gb": 0.5,
                                                                         "pids": 4096}
    assert "holding 64 MiB" in cluster.log(job["id"])
    _wait_cgroup_removed(cluster, done)
