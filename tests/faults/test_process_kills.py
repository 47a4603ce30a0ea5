"""kill -9 mid-job of a job's process, of a host agent and of the console's Celery worker.

Each time the job ends failed with a reason, or goes back to the queue within its retries (at most 3), within
60 s, never stays "running", and leaves no GPU held.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults.conftest import record_fault
from tests.faults.support import (
    assert_ledger_holds,
    counted_job,
    gone,
    held_gpus,
    job_pid,
    runs_of,
    start_cluster,
    wait_all_final,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, private_postgres, private_redis):
    live = start_cluster(tmp_path_factory.mktemp("kills"), private_postgres, private_redis,
                         agents={"fk-a": "2xH200", "fk-b": "2xH200"})
    try:
        yield live
    finally:
        live.stop()
    assert_ledger_holds(live)


def test_kill_9_of_the_job_process_fails_it_with_the_signal_and_frees_its_gpu(cluster):
    job = counted_job(cluster, 600, name="victim")
    cluster.wait_state(job["id"], {"running"})
    pid = job_pid(cluster, job["id"])
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    done = cluster.wait_state(job["id"], {"failed", "queued", "succeeded"}, timeout=60)
    took = time.monotonic() - killed_at
    assert done["state"] == "failed" and "SIGKILL" in done["failure_reason"], done
    assert done["exit_code"] == 128 + signal.SIGKILL
    assert held_gpus(cluster, job["id"]) == 0
    assert_ledger_holds(cluster)
    record_fault("kill -9 of a job's process", f"job failed: {done['failure_reason']}", took, 0)


@pytest.fixture
def agents_back(cluster):
    """Whatever the test did to the agents, the next test finds both up (systemd's Restart=always)."""
    yield
    for name in cluster.agents:
        if cluster.processes[f"agent-{name}"].poll() is not None:
            cluster.start_agent(name)
    cluster.wait_for(lambda: cluster._hosts_up() == len(cluster.agents), timeout=60, what="both agents to come back")


@pytest.mark.usefixtures("agents_back")
def test_kill_9_of_an_agent_requeues_within_retries_then_fails(cluster):
    job = counted_job(cluster, 600, name="on-dying-hosts", max_retries=1)
    first = cluster.wait_state(job["id"], {"running"})
    host = first["allocations"][0]["host"]
    assert host in {"fk-a", "fk-b"}, first
    pid = job_pid(cluster, job["id"])
    killed_at = time.monotonic()
    cluster.kill(f"agent-{host}")
    cluster.wait_for(lambda: gone(pid), timeout=60, what="the job's process to die with its agent")
    # Retry 1 of 1: back in the queue, then running again on the other host.
    again = cluster.wait_for(lambda: (j := cluster.job(job["id"]))["state"] == "running" and j["attempts"] == 2
                             and j, timeout=90, what="the job to run again elsewhere")
    requeue_took = time.monotonic() - killed_at
    other = again["allocations"][0]["host"]
    assert other != host
    events = [e["reason"] for e in cluster.admin().get(f"/api/v1/jobs/{job['id']}/events/").json()["results"]]
    assert any("requeued, retry 1 of 1" in reason for reason in events), events
    record_fault("kill -9 of a host agent (job with 1 retry)", f"requeued, ran again on {other}", requeue_took, 0)

    pid = job_pid(cluster, job["id"], attempt=2)
    killed_at = time.monotonic()
    cluster.kill(f"agent-{other}")
    done = cluster.wait_state(job["id"], {"failed"}, timeout=60)
    took = time.monotonic() - killed_at
    assert done["failure_reason"].startswith("host lost"), done
    assert gone(pid)
    assert held_gpus(cluster, job["id"]) == 0
    assert runs_of(cluster, job["id"]) == (2, 0)
    record_fault("kill -9 of the second agent (retries used up)", "job failed: host lost", took, 0)
    assert_ledger_holds(cluster)


def test_kill_9_of_the_celery_worker_loses_no_job_and_runs_none_twice(cluster):
    running = counted_job(cluster, 20, name="runs-through")
    cluster.wait_state(running["id"], {"running"})
    killed_at = time.monotonic()
    cluster.kill_group("worker")  # the worker, its pool and its embedded beat
    # Submissions are accepted while no worker runs: the database is the queue's truth.
    waiting = [counted_job(cluster, 2, name=f"while-down-{n}") for n in range(3)]
    time.sleep(5)
    assert all(cluster.job(job["id"])["state"] == "queued" for job in waiting)
    cluster.restart("worker")  # as systemd's Restart=always does
    jobs = wait_all_final(cluster, [running["id"]] + [job["id"] for job in waiting], timeout=90)
    took = time.monotonic() - killed_at
    assert {job["state"] for job in jobs.values()} == {"succeeded"}, jobs
    assert all(runs_of(cluster, job_id) == (1, 1) for job_id in jobs), {j: runs_of(cluster, j) for j in jobs}
    assert_ledger_holds(cluster)
    record_fault("kill -9 of the Celery worker (and its beat), restarted",
                 "running job went on; 3 jobs queued meanwhile placed after the restart", took, 0)
