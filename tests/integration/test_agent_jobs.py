"""Jobs run by real host agents: real ASGI server, real Celery worker and broker, agents with simulated GPUs.

The agents run job processes for real (torchrun for multi-GPU jobs, with c10d rendezvous across two agents).
"""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.live import LiveCluster, create_team, gone

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    live = LiveCluster(base, agents={"it-a": "2xH200", "it-b": "2xH200", "it-c": "1xL40S", "it-d": "1xA100",
                                     "it-e": "2xL4"},
                       extra_env={"GPU_AGENT_VOLUME_ROOTS": str(base / "volumes")})
    try:
        live.start()
        admin = live.admin()
        create_team(admin, "it", 8)
        # Started first and checked last: it must be stopped by its one-minute time limit meanwhile.
        live.time_limited = live.submit(gpus=1, gpu_type="A100", time_limit_minutes=1,
                                        workload={"command": [PY, str(SCRIPTS / "show_env.py"), "600"]})
        yield live
    finally:
        live.stop()


def proc_lines(log: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in re.findall(r"proc pid=.*", log)]


def test_the_end_is_recorded_with_the_exit_the_agent_saw(cluster):
    # The agent reports the end from the thread that saw the exit, before any cleanup (tests/agent/
    # test_end_report.py holds the cleanup to show it); here the console keeps that exit time with the end.
    # benchmarks/job_end_latency.py measures the gap.
    job = cluster.submit(gpus=2, gpu_type="H200", preset="ddp",
                         workload={"command": ["python", str(SCRIPTS / "show_env.py")]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", cluster.log(job["id"])
    events = cluster.admin().get(f"/api/v1/jobs/{job['id']}/events/").json()["results"]
    end = next(e for e in events if e["to_state"] == "succeeded")
    exited_at = end["data"]["exited_at"]
    assert exited_at <= datetime.fromisoformat(done["finished_at"]).timestamp()
    assert datetime.fromisoformat(done["started_at"]).timestamp() <= exited_at


def test_ddp_job_runs_one_process_per_placed_gpu(cluster):
    job = cluster.submit(gpus=2, gpu_type="H200", preset="ddp",
                         workload={"command": ["python", str(SCRIPTS / "show_env.py")]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    log = cluster.log(job["id"])
    assert done["state"] == "succeeded", log
    placed = ",".join(str(a["index"]) for a in cluster.job(job["id"])["allocations"])
    procs = proc_lines(log)
    assert len(procs) == 2, log
    assert {p["cvd"] for p in procs} == {placed}
    assert sorted(p["local_rank"] for p in procs) == ["0", "1"]
    assert {p["preset"] for p in procs} == {"ddp"}
    assert "torch.distributed.run --nproc-per-node 2 --standalone" in log


def test_builtin_ddp_training_succeeds_with_progress(cluster):
    job = cluster.submit(gpus=2, gpu_type="H200", preset="ddp", max_steps=6,
                         workload={"builtin": "mlp-digits", "params": {"epochs": 1, "batch_size": 32}})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=180)
    assert done["state"] == "succeeded", cluster.log(job["id"])
    assert done["exit_code"] == 0 and done["steps_done"] == 6
    assert done["steps_per_second"] and done["samples_per_second"]
    events = cluster.admin().get(f"/api/v1/jobs/{job['id']}/events/").json()["results"]
    assert [e["to_state"] for e in events] == ["queued", "placed", "running", "succeeded"]
    files = {a["path"] for a in cluster.admin().get(f"/api/v1/jobs/{job['id']}/artifacts/").json()}
    assert "logs/attempt-1-node-0.log" in files and "outputs/model.pt" in files


def test_four_gpu_ddp_job_spans_two_agents(cluster):
    job = cluster.submit(gpus=4, gpu_type="H200", preset="ddp",
                         workload={"command": ["python", str(SCRIPTS / "show_env.py")]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=180)
    log = cluster.log(job["id"])
    assert done["state"] == "succeeded", log
    assert {a["host"] for a in done["allocations"]} == {"it-a", "it-b"}
    procs = proc_lines(log)
    assert len(procs) == 4, log
    assert sorted(p["rank"] for p in procs) == ["0", "1", "2", "3"]
    assert {p["world"] for p in procs} == {"4"}
    assert sorted(p["local_rank"] for p in procs) == ["0", "0", "1", "1"]
    # One torchrun on each host, meeting through c10d rendezvous at node rank 0's address.
    assert re.search(rf"\[agent\] job {job['id']} attempt 1 on it-a GPUs 0,1: .*--rdzv-backend c10d", log)
    assert re.search(rf"\[agent\] job {job['id']} attempt 1 on it-b GPUs 0,1: .*--rdzv-backend c10d", log)


def test_cancel_stops_every_process_of_the_job(cluster):
    job = cluster.submit(gpus=1, gpu_type="H200", workload={"command": [PY, str(SCRIPTS / "spawn_children.py")]})
    cluster.wait_state(job["id"], {"running"})
    line = cluster.wait_for(lambda: re.search(r"^pids ([\d ]+)$", cluster.log(job["id"]), re.M), timeout=60,
                            what="the job to print its pids")
    pids = [int(pid) for pid in line.group(1).split()]
    assert not any(gone(pid) for pid in pids)
    assert cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={}).status_code == 200
    cluster.wait_for(lambda: all(gone(pid) for pid in pids), timeout=60, what="every process of the job to stop")
    assert cluster.wait_state(job["id"], {"cancelled", "failed", "succeeded"}, timeout=60)["state"] == "cancelled"


def test_redelivered_dispatch_message_is_a_no_op(cluster):
    # The job outlasts the test: on a busy machine `manage.py shell` alone takes longer than a short job, and a
    # dispatch message of a job that has ended is refused by the console instead (another test's case).
    job = cluster.submit(gpus=1, gpu_type="H200", workload={"command": [PY, str(SCRIPTS / "show_env.py"), "600"]})
    cluster.wait_state(job["id"], {"running"})
    cluster.manage("shell", "-c", (
        "from celery import current_app; from apps.jobs.models import Job; "
        "from apps.jobs.services import dispatch_messages; from workers.protocol import RUN_JOB_TASK, host_queue; "
        f"job = Job.objects.get(pk={job['id']}); "
        "[current_app.send_task(RUN_JOB_TASK, args=[m.to_message()], queue=host_queue(h)) "
        "for h, m in dispatch_messages(job)]"
    ))
    cluster.wait_for(lambda: "'duplicate'" in cluster.logs_tail(400), timeout=60,
                     what="the agent to answer the second message with 'duplicate'")
    assert cluster.job(job["id"])["state"] == "running"
    cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/", json={})
    cluster.wait_state(job["id"], {"cancelled"})
    log = cluster.log(job["id"])
    assert log.count(f"[agent] job {job['id']} attempt 1") == 1
    assert len(proc_lines(log)) == 1
    events = cluster.admin().get(f"/api/v1/jobs/{job['id']}/events/").json()["results"]
    assert [e["to_state"] for e in events].count("running") == 1


def test_each_task_of_a_job_array_runs_told_its_index(cluster):
    show = "import os; print('task', *(os.environ[f'CONSOLE_ARRAY_{n}'] for n in ('TASK_ID', 'TASK_COUNT', 'JOB_ID')))"
    first = cluster.submit(gpus=1, array_size=2, workload={"command": [PY, "-c", show]})
    ids = first["array_job_ids"]
    for index, job_id in enumerate(ids):
        done = cluster.wait_state(job_id, {"succeeded", "failed"})
        assert done["state"] == "succeeded", cluster.log(job_id)
        assert f"task {index} 2 {first['id']}" in cluster.log(job_id)


def test_a_command_that_does_not_exist_fails_with_reason(cluster):
    job = cluster.submit(gpus=1, workload={"command": ["/nonexistent/train-model", "--fast"]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    assert done["state"] == "failed" and done["exit_code"] == 127
    assert "could not start the job" in done["failure_reason"]
    assert "command not found: '/nonexistent/train-model'" in cluster.log(job["id"])


def test_a_crashing_script_fails_with_its_exit_code_and_log(cluster):
    job = cluster.submit(gpus=1, workload={"command": [PY, str(SCRIPTS / "crash.py")]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    assert done["state"] == "failed" and done["exit_code"] == 1
    assert done["failure_reason"] == "exited with code 1"
    log = cluster.log(job["id"])
    assert "loading data" in log and "RuntimeError: CUDA out of patience" in log


def test_unknown_builtin_or_preset_is_refused_at_submission(cluster):
    admin = cluster.admin()
    bad = admin.post("/api/v1/jobs/", json={"team": "it", "name": "x", "gpus": 1, "workload": {"builtin": "nope"}})
    assert bad.status_code == 400 and "workload" in bad.json()
    bad = admin.post("/api/v1/jobs/", json={"team": "it", "name": "x", "gpus": 1, "preset": "turbo",
                                            "workload": {"builtin": "mlp-digits"}})
    assert bad.status_code == 400 and "preset" in bad.json()


def test_kill_9_of_the_agent_leaves_no_job_running(cluster):
    job = cluster.submit(gpus=1, gpu_type="L40S", workload={"command": [PY, str(SCRIPTS / "show_env.py"), "600"]})
    cluster.wait_state(job["id"], {"running"})
    pid = int(cluster.wait_for(lambda: proc_lines(cluster.log(job["id"])), timeout=60, what="the job to start")[0]
              ["pid"])
    cluster.kill("agent-it-c")
    cluster.wait_for(lambda: gone(pid), timeout=60, what="the job process to die with its agent")
    # Declared lost after the heartbeat timeout (30 s): generous, a timeout here only means "never".
    done = cluster.wait_state(job["id"], {"failed", "queued"}, timeout=150)
    assert done["state"] == "failed" and done["failure_reason"].startswith("host lost")
    hosts = {h["name"]: h["state"] for h in cluster.admin().get("/api/v1/hosts/").json()["results"]}
    assert hosts["it-c"] == "down"
    # The agent comes back: the host is up again and takes work.
    cluster.start_agent("it-c")
    cluster.wait_for(lambda: {h["name"]: h["state"] for h in cluster.admin().get("/api/v1/hosts/").json()["results"]}
                     ["it-c"] == "up", timeout=90, what="the host to come back")


def test_time_limit_stops_the_job(cluster):
    done = cluster.wait_state(cluster.time_limited["id"], {"succeeded", "failed"}, timeout=120)
    assert done["state"] == "failed"
    assert done["failure_reason"].startswith("time limit of 1 minutes exceeded")


def test_urgent_job_preempts_a_low_one_which_resumes_from_its_checkpoint(cluster):
    # Long enough (100,000 steps) never to finish on its own during the test, however fast the machine.
    low = cluster.submit(gpus=2, gpu_type="L4", priority="low", max_steps=100_000,
                         workload={"builtin": "mlp-digits", "params": {"epochs": 10_000, "batch_size": 32}})
    cluster.wait_for(lambda: cluster.job(low["id"])["steps_done"] >= 30, timeout=90, what="the low job to train")
    urgent = cluster.submit(gpus=2, gpu_type="L4", priority="urgent",
                            workload={"command": [PY, str(SCRIPTS / "show_env.py"), "2"]})
    assert cluster.wait_state(urgent["id"], {"succeeded", "failed"}, timeout=120)["state"] == "succeeded"
    resumed = cluster.wait_for(
        lambda: re.search(r"resumed from \S+ \(step (\d+)", cluster.log(low["id"])), timeout=120,
        what="the low job to resume from its checkpoint")
    assert int(resumed.group(1)) >= 30
    again = cluster.job(low["id"])
    assert again["state"] == "running" and again["preemption_count"] == 1 and again["attempts"] == 2
    events = cluster.admin().get(f"/api/v1/jobs/{low['id']}/events/").json()["results"]
    reasons = [e["reason"] for e in events]
    assert any(r.startswith("preemption requested") and f"job {urgent['id']}" in r for r in reasons), reasons
    assert any(r.startswith("preempted on it-e") for r in reasons), reasons
    assert [e["to_state"] for e in events if e["to_state"]] == [
        "queued", "placed", "running", "preempted", "queued", "placed", "running"]
    files = {a["path"] for a in cluster.admin().get(f"/api/v1/jobs/{low['id']}/artifacts/").json()}
    assert any(path.startswith("checkpoints/") for path in files), files
    cluster.admin().post(f"/api/v1/jobs/{low['id']}/cancel/", json={})
    cluster.wait_state(low["id"], {"cancelled"})


def test_gpuctl_submit_wait_streams_the_training_log_and_exits_0(cluster, tmp_path):
    import subprocess

    env = {**os.environ, "GPUCTL_CONFIG": str(tmp_path / "gpuctl.json")}
    login = subprocess.run([PY, "-m", "workers.cli", "login", "--url", cluster.url, "--username", "admin",
                            "--password-stdin"], input="integration-admin-pass-42\n", env=env, capture_output=True,
                           text=True, timeout=60)
    assert login.returncode == 0, login.stderr
    submit = subprocess.run([PY, "-m", "workers.cli", "submit", "--team", "it", "--builtin", "cnn-digits",
                             "--preset", "amp-bf16", "--gpus", "1", "--gpu-type", "H200", "--max-steps", "8",
                             "--param", "epochs=1", "--wait"], env=env, capture_output=True, text=True, timeout=300)
    assert submit.returncode == 0, submit.stderr + submit.stdout
    assert "preset amp-bf16" in submit.stdout and "step 8/8" in submit.stdout
    assert "succeeded" in submit.stderr


def test_a_job_without_an_image_runs_in_its_uploaded_code_with_its_variables(cluster, tmp_path):
    """The process backend gives a job its spec's code (fetched into its folder, the working directory) and plain
    variables, as the container backend does (its secrets and volumes: the test below)."""
    from workers import codepack

    code = tmp_path / "code"
    code.mkdir()
    (code / "main.py").write_text("import os, pathlib\n"
                                  "print('greeting=' + os.environ['GREETING'])\n"
                                  "print('data=' + pathlib.Path('data.txt').read_text())\n")
    (code / "data.txt").write_text("from-the-snapshot")
    # Modules of the job's code that shadow what the agent's shim imports run in no process of the agent's.
    for shadow in ("argparse", "json", "subprocess"):
        (code / f"{shadow}.py").write_text(f"print('shadowed {shadow} ran'); raise SystemExit(3)\n")
    with codepack.pack(code) as packed:
        upload = cluster.admin().post("/api/v1/code-snapshots/", data={"team": "it"},
                                      files={"archive": ("code.tar.gz", packed.path.read_bytes())})
    assert upload.status_code == 201, upload.text
    job = cluster.submit(gpus=1, gpu_type="H200", env={"GREETING": "hello-from-env"},
                         code={"snapshot": upload.json()["id"]}, workload={"command": [PY, "main.py"]})
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    log = cluster.log(job["id"])
    assert done["state"] == "succeeded", log
    assert "greeting=hello-from-env" in log and "data=from-the-snapshot" in log
    assert "shadowed" not in log
    assert done["backend"] == "process"



def test_a_job_without_an_image_gets_its_secrets_and_volumes_only_on_a_host_that_runs_it_under_its_own_uid(cluster):
    """A process job given secrets and a volume goes only to hosts whose agents run each job under a uid of its own
    (no other job can read its environment or reach its view there); the values reach its environment and are masked
    in its log, the volume is at its target, read-only. An agent that is not root cannot switch users: its hosts
    register so, and the job waits saying why."""
    secret = "process-secret-0123456789"
    created = cluster.admin().post("/api/v1/teams/it/secrets/", json={"name": "API_KEY", "value": secret})
    assert created.status_code == 201, created.text
    data = cluster.base / "volumes" / "it-data"
    data.mkdir(parents=True)
    (data / "labels.txt").write_text("cat-dog")
    data.chmod(0o755)
    (data / "labels.txt").chmod(0o644)
    volume = cluster.admin().post("/api/v1/volumes/", json={"name": "it-data", "host_path": str(data),
                                                            "target": "/mnt/it-data", "teams": ["it"]})
    assert volume.status_code == 201, volume.text
    hosts = {h["name"]: h["job_isolation"] for h in cluster.admin().get("/api/v1/hosts/").json()["results"]}
    script = ("import os\n"
              "key = os.environ['API_KEY']\n"
              "print('key=' + key, 'length', len(key), 'uid', os.getuid())\n"
              "print('labels=' + open('/mnt/it-data/labels.txt').read())\n"
              "try:\n"
              "    open('/mnt/it-data/new.txt', 'w')\n"
              "except OSError as exc:\n"
              "    print('write:', exc.strerror)\n")
    job = cluster.submit(gpus=1, gpu_type="H200", secrets=["API_KEY"], mounts=["it-data"],
                         workload={"command": [PY, "-c", script]})
    if os.geteuid() != 0:
        assert set(hosts.values()) == {"agent-user"}, hosts
        waiting = cluster.wait_for(lambda: (j := cluster.job(job["id"]))["pending_reason"] and j, timeout=60,
                                   what="the job's pending reason")
        assert waiting["state"] == "queued" and "--job-uids" in waiting["pending_reason"], waiting
        cluster.admin().post(f"/api/v1/jobs/{job['id']}/cancel/")
        return
    assert set(hosts.values()) == {"own-uid"}, hosts
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    log = cluster.log(job["id"])
    assert done["state"] == "succeeded", log
    assert f"key=**** length {len(secret)} uid " in log and secret not in log
    assert "labels=cat-dog" in log and "write: Read-only file system" in log and not (data / "new.txt").exists()
    assert done["runtime_info"]["isolation"] == "own-uid"
