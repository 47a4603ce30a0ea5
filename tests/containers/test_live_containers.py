"""The acceptance path end to end: a real console, Celery worker and a podman agent; a user's own PyTorch
script from a local directory submitted with `gpuctl submit --code . --image …` and a team secret; a service from a
user's image answering through the gateway and scaling."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.containers.conftest import oci_runtime
from tests.containers.service_server import SERVER
from tests.integration.live import ADMIN_PASSWORD, LiveCluster, create_team

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# A host name of this module's own: containers are labelled with it, and an agent removes every container of
# its name at start (two clusters on this machine, under xdist, must not share one).
HOST = f"ctr-{uuid.uuid4().hex[:8]}"

TRAIN = """\
import os, torch
from workers.protocol import JobEnvironment
from workers.runtime.reporting import Reporter

env = JobEnvironment.from_env(os.environ)
reporter = Reporter(env.progress_file)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 6):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    reporter.progress(step=step, max_steps=5, loss=float(loss), steps_per_s=10.0, samples_per_s=80.0)
print("key", os.environ["WANDB_API_KEY"], "in", os.getcwd(), "torch", torch.__version__, flush=True)
"""


@pytest.fixture(scope="session")
def runtime_kind(podman: None) -> str:
    """The live cluster's agents run podman (--runtime podman): its tests run once, on that runtime."""
    return "podman"


@pytest.fixture(scope="module")
def cluster(podman: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveCluster]:
    live = LiveCluster(tmp_path_factory.mktemp("containers"), agents={HOST: "2xH200"},
                       extra_env={"GPU_AGENT_RUNTIME": "podman", "GPU_AGENT_OCI_RUNTIME": oci_runtime(),
                                  "CONSOLE_SERVING_RECONCILE_S": "1"})
    try:
        live.start()
        create_team(live.admin(), "ctr", 4)
        yield live
    finally:
        live.stop()


def test_gpuctl_submit_code_and_image_runs_in_the_container_with_progress_and_a_masked_secret(
        cluster: LiveCluster, torch_image: str, tmp_path: Path) -> None:
    secret = "wandb-live-0123456789"
    created = cluster.admin().post("/api/v1/teams/ctr/secrets/", json={"name": "WANDB_API_KEY", "value": secret})
    assert created.status_code == 201, created.text
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    env = {**os.environ, "GPUCTL_CONFIG": str(tmp_path / "gpuctl.json")}
    gpuctl = [sys.executable, "-m", "workers.cli"]
    login = subprocess.run([*gpuctl, "login", "--url", cluster.url, "--username", "admin", "--password-stdin"],
                           input=f"{ADMIN_PASSWORD}\n", env=env, capture_output=True, text=True, timeout=60)
    assert login.returncode == 0, login.stderr
    submit = subprocess.run([*gpuctl, "submit", "--team", "ctr", "--gpus", "1", "--gpu-type", "H200", "--image",
                             torch_image, "--code", str(project), "--secret", "WANDB_API_KEY", "--wait", "--",
                             "python3", "train.py"], cwd=project, env=env, capture_output=True, text=True,
                            timeout=300)
    assert submit.returncode == 0, submit.stderr + submit.stdout + cluster.logs_tail()
    jobs = cluster.admin().get("/api/v1/jobs/", params={"team": "ctr"}).json()
    job = (jobs["results"] if isinstance(jobs, dict) else jobs)[0]
    job_id = job["id"]
    done = cluster.job(job_id)
    log = cluster.log(job_id)
    assert done["state"] == "succeeded", log
    assert done["steps_done"] == 5
    assert "key **** in /workspace/code torch 2.13.0" in log and secret not in log and secret not in submit.stdout
    assert done["runtime_info"]["backend"] == "podman"
    assert done["runtime_info"]["image"].startswith("localhost/gpu-console-test-torch@sha256:")
    leftovers = subprocess.run(["podman", "ps", "-aq", "--filter", f"label=gpu-console.host={HOST}"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert leftovers == []


def containers_of(host: str) -> list[str]:
    return subprocess.run(["podman", "ps", "-aq", "--filter", f"label=gpu-console.host={host}"],
                          capture_output=True, text=True, check=True).stdout.split()


def test_an_urgent_job_preempts_a_container_job_which_resumes_from_its_checkpoint(
        cluster: LiveCluster, torch_image: str) -> None:
    low = cluster.submit(team="ctr", gpus=2, gpu_type="H200", priority="low", max_steps=100_000, image=torch_image,
                         workload={"builtin": "tiny-lm", "params": {"epochs": 10_000, "batch_size": 8,
                                                                    "d_model": 32, "layers": 1, "seq_len": 16}})
    cluster.wait_for(lambda: cluster.job(low["id"])["steps_done"] >= 30, timeout=120, what="the low job to train")
    urgent = cluster.submit(team="ctr", gpus=2, gpu_type="H200", priority="urgent", image=torch_image,
                            workload={"command": ["python3", "-c", "print('urgent done')"]})
    assert cluster.wait_state(urgent["id"], {"succeeded", "failed"}, timeout=120)["state"] == "succeeded"
    resumed = cluster.wait_for(
        lambda: re.search(r"resumed from \S+ \(step (\d+)", cluster.log(low["id"])), timeout=120,
        what="the low job to resume from its checkpoint")
    assert int(resumed.group(1)) >= 30
    again = cluster.job(low["id"])
    assert again["state"] == "running" and again["preemption_count"] == 1 and again["attempts"] == 2
    # the first attempt's and the urgent job's containers go (each removed after its end is reported)
    cluster.wait_for(lambda: len(containers_of(HOST)) == 1, timeout=60, what="only the resumed job's container left")
    cluster.admin().post(f"/api/v1/jobs/{low['id']}/cancel/", json={})
    cluster.wait_state(low["id"], {"cancelled"})
    cluster.wait_for(lambda: not containers_of(HOST), timeout=60, what="the cancelled job's container to go")


def test_kill_9_of_the_agent_leaves_no_container_and_a_restarted_agent_runs_again(
        cluster: LiveCluster, torch_image: str) -> None:
    job = cluster.submit(team="ctr", gpus=1, gpu_type="H200", image=torch_image,
                         workload={"command": ["python3", "-c", "import time; print('up', flush=True); "
                                                                "time.sleep(600)"]})
    cluster.wait_for(lambda: "up" in cluster.log(job["id"]).splitlines(), timeout=120, what="the job to start")
    assert containers_of(HOST)
    cluster.kill(f"agent-{HOST}")
    cluster.wait_for(lambda: not containers_of(HOST), timeout=60, what="the container to go with the agent")
    cluster.restart(f"agent-{HOST}")
    done = cluster.wait_state(job["id"], {"failed", "queued", "running", "succeeded"}, timeout=120)
    assert done["state"] != "succeeded"
    cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})
    cluster.wait_for(lambda: cluster.job(job["id"])["state"] in {"cancelled", "failed"}, timeout=120,
                     what="the job to end")
    cluster.wait_for(lambda: not containers_of(HOST), timeout=60, what="no container left")


def test_a_service_from_a_user_image_answers_through_the_gateway_and_scales(cluster: LiveCluster,
                                                                            base_image: str) -> None:
    admin = cluster.admin()
    created = admin.post("/api/v1/services/", json={
        "team": "ctr", "name": "own-server", "image": base_image, "command": ["python3", "-c", SERVER],
        "env": {"MODEL": "sums"}, "min_replicas": 1, "max_replicas": 2, "target_rps_per_replica": 2})
    assert created.status_code == 201, created.text
    service = created.json()

    def detail() -> dict:
        return admin.get(f"/api/v1/services/{service['id']}/").json()

    cluster.wait_for(lambda: detail()["stats"]["ready"] >= 1, timeout=120, what="the first replica to be ready")
    gateway = httpx.Client(base_url=cluster.url, headers=admin.headers, timeout=30)
    answer = gateway.post(service["endpoint"], json={"inputs": [[1, 2], [3]]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"outputs": [3, 3], "model": "sums", "secret_seen": False}
    first = int(answer.headers["X-Replica-Job"])
    assert cluster.job(first)["runtime_info"]["backend"] == "podman"

    # Load past 2 req/s per replica: the autoscaler adds a replica, and the gateway sends it requests too.
    stop, failures, answered_by = threading.Event(), [], set()

    def load() -> None:
        with httpx.Client(base_url=cluster.url, headers=admin.headers, timeout=30) as client:
            while not stop.is_set():
                response = client.post(service["endpoint"], json={"inputs": [[1, 1]]})
                if response.status_code == 200:
                    answered_by.add(int(response.headers["X-Replica-Job"]))
                else:
                    failures.append(response.status_code)

    workers = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        cluster.wait_for(lambda: detail()["desired_replicas"] == 2, timeout=90, what="a scale-up under load")
        cluster.wait_for(lambda: detail()["stats"]["ready"] == 2, timeout=120, what="the second replica to be ready")
        cluster.wait_for(lambda: answered_by - {first}, timeout=60, what="the new replica to answer")
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
    assert failures == []
    events = admin.get(f"/api/v1/services/{service['id']}/events/").json()["results"]
    assert any(e["kind"] == "scale_up" and "req/s per replica > target 2.0" in e["reason"] for e in events)

    assert admin.delete(f"/api/v1/services/{service['id']}/").status_code == 204
    cluster.wait_for(lambda: not containers_of(HOST), timeout=60, what="the replicas' containers to go")
    assert all(cluster.job(job)["state"] in {"stopped", "cancelled", "succeeded", "failed"} for job in answered_by)
