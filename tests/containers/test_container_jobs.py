"""Jobs in OCI containers, run by a real JobRunner with real podman (and docker, where its daemon runs) and locally
built images."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from tests.containers.conftest import JOB_UIDS, Agent, Console
from tests.containers.service_server import SERVER
from workers.protocol import (
    CODE_PATH,
    CONTAINER_HOME,
    JOB_CODE_PATH,
    REPLICA_SECRET_HEADER,
    CodeSnapshot,
    MountSpec,
)

PROGRESS_SCRIPT = (
    "import json, os\n"
    "with open(os.environ['CONSOLE_PROGRESS_FILE'], 'a') as f:\n"
    "    f.write(json.dumps({'type': 'progress', 'step': 3, 'total_steps': 3, 'loss': 0.5}) + '\\n')\n"
    "print('uid', os.getuid(), 'home', os.environ['HOME'], 'cwd', os.getcwd(), flush=True)\n"
    "print('greeting', os.environ.get('GREETING'), 'token', os.environ.get('WANDB_API_KEY'), flush=True)\n"
    "import sys; sys.stdout.write('split s3cr'); sys.stdout.flush()\n"
    "import time; time.sleep(0.3); print('et-value-42 done', flush=True)\n"
    "import workers.runtime, workers.protocol\n"
    "print('runtime at', workers.runtime.__file__)\n"
    "print('fds', sorted(int(fd) for fd in os.listdir('/proc/self/fd')))\n"
)
# Ends on SIGTERM after writing a checkpoint (what a preempted job does), else sleeps.
TERM_SCRIPT = (
    "import os, signal, sys, time\n"
    "def term(*_):\n"
    "    open(os.path.join(os.environ['CONSOLE_CHECKPOINT_DIR'], 'ckpt'), 'w').write('step 7')\n"
    "    print('checkpointed', flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


def job_processes() -> list[int]:
    """Processes running under the test agents' job uids (a container's processes included)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            if JOB_UIDS[0] <= uid <= JOB_UIDS[1]:
                found.append(int(entry))
    return found


def targz(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload(console: Console, token: str, files: dict[str, str]) -> dict[str, CodeSnapshot]:
    archive = targz(files)
    console.code[token] = archive
    return {"code": CodeSnapshot("upload", JOB_CODE_PATH, sha256=hashlib.sha256(archive).hexdigest(),
                                 size=len(archive))}


def test_a_job_runs_in_its_image_under_its_own_uid_with_env_secret_masked_and_progress(
        agent: Agent, console: Console, base_image: str) -> None:
    secret = "s3cret-value-42"
    dispatch = agent.dispatch(base_image, ["python3", "-c", PROGRESS_SCRIPT],
                              container={"env": {"GREETING": "hello"}, "secrets": {"WANDB_API_KEY": secret}})
    assert agent.runner.start(dispatch) == "started"
    final = console.wait_final(dispatch.job_id)
    log = console.log(dispatch.job_id)
    assert final["state"] == "succeeded", log
    running = console.statuses[dispatch.job_id][0]
    assert running["state"] == "running" and running["details"]["backend"] == agent.cli
    # podman records the image by digest; an image loaded into docker (not pulled) has only its id.
    assert running["details"]["image"].startswith(
        "localhost/gpu-console-test-base@sha256:" if agent.cli == "podman" else "sha256:")
    assert running["details"]["isolation"] == "own-uid"
    assert f"home {CONTAINER_HOME} cwd {CONTAINER_HOME}" in log and f"uid {JOB_UIDS[0]}" in log
    assert "greeting hello token ****" in log and "split **** done" in log and secret not in log
    assert secret not in (agent.runner.work_root / f"job-{dispatch.job_id}" / "attempt-1" / "output.log").read_text()
    assert "runtime at /opt/gpu-console-runtime/workers/runtime/__init__.py" in log
    assert "fds [0, 1, 2, 3]" in log  # nothing of the agent's (the env file's memfd) leaks in
    assert console.progress[dispatch.job_id][-1]["step"] == 3
    assert agent.containers_left(console) == []
    assert not list((agent.runner.work_root / f"job-{dispatch.job_id}" / "attempt-1").glob("*env*"))
    # The dispatch named the secret only; the agent fetched its value with the host token, once, for this job.
    assert secret not in json.dumps(dispatch.to_message()) and dispatch.container.secrets == ("WANDB_API_KEY",)
    assert console.secret_fetches == [(dispatch.job_id, "Host host-token")]


def test_a_job_whose_secrets_the_console_refuses_fails_before_its_container_starts(
        agent: Agent, console: Console, base_image: str) -> None:
    dispatch = agent.dispatch(base_image, ["python3", "-c", "print('never ' + 'ran')"],
                              container={"secrets": {"WANDB_API_KEY": "unused-value"}})
    console.secrets.clear()  # the console refuses: say, the attempt was stopped meanwhile
    assert agent.runner.start(dispatch) == "started"
    final = console.wait_final(dispatch.job_id)
    assert final["state"] == "failed" and final["reason"].startswith("could not fetch the job's secrets: job "), final
    assert "never ran" not in console.log(dispatch.job_id) and agent.containers() == []


def test_uploaded_code_is_the_working_directory(agent: Agent, console: Console, base_image: str) -> None:
    dispatch = agent.dispatch(base_image, ["python3", "main.py"])
    dispatch = agent.dispatch(base_image, ["python3", "main.py"], job_token=dispatch.job_token,
                              container=upload(console, dispatch.job_token,
                                               {"main.py": "import os; print('in', os.getcwd(), open('data.txt').read())",
                                                "data.txt": "payload"}))
    agent.runner.start(dispatch)
    assert console.wait_final(dispatch.job_id)["state"] == "succeeded", console.log(dispatch.job_id)
    assert f"in {CODE_PATH} payload" in console.log(dispatch.job_id)


def test_a_snapshot_that_does_not_match_its_digest_fails_the_job(agent: Agent, console: Console,
                                                                 base_image: str) -> None:
    dispatch = agent.dispatch(base_image, ["python3", "main.py"])
    snapshot = upload(console, dispatch.job_token, {"main.py": "print(1)"})["code"]
    bad = CodeSnapshot("upload", JOB_CODE_PATH, sha256="0" * 64, size=snapshot.size)
    dispatch = agent.dispatch(base_image, ["python3", "main.py"], job_token=dispatch.job_token,
                              container={"code": bad})
    agent.runner.start(dispatch)
    final = console.wait_final(dispatch.job_id)
    assert final["state"] == "failed" and "could not fetch the job's code" in final["reason"]
    assert "sha256" in final["reason"]


def test_git_code_is_checked_out_at_its_commit(agent: Agent, console: Console, base_image: str,
                                              tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "main.py").write_text("print('version one')")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "main.py").write_text("print('version two')")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    dispatch = agent.dispatch(base_image, ["python3", "main.py"],
                              container={"code": CodeSnapshot("git", str(repo), ref="main", commit=commit)})
    agent.runner.start(dispatch)
    assert console.wait_final(dispatch.job_id)["state"] == "succeeded", console.log(dispatch.job_id)
    assert "version one" in console.log(dispatch.job_id)


def test_mounts_only_below_the_volume_roots_read_only_by_default(agent: Agent, console: Console,
                                                                base_image: str, tmp_path: Path) -> None:
    (agent.volumes / "data").mkdir()
    (agent.volumes / "data" / "x.txt").write_text("dataset")
    script = ("print(open('/mnt/data/x.txt').read())\n"
              "try:\n    open('/mnt/data/y', 'w')\nexcept OSError as e:\n    print('write refused', e.errno)\n")
    good = agent.dispatch(base_image, ["python3", "-c", script],
                          container={"mounts": (MountSpec("data", str(agent.volumes / "data"), "/mnt/data"),)})
    agent.runner.start(good)
    assert console.wait_final(good.job_id)["state"] == "succeeded", console.log(good.job_id)
    assert "dataset" in console.log(good.job_id) and "write refused 30" in console.log(good.job_id)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for source in (outside, agent.volumes / ".." / "elsewhere"):
        bad = agent.dispatch(base_image, ["true"], container={"mounts": (MountSpec("x", str(source), "/mnt/x"),)})
        agent.runner.start(bad)
        final = console.wait_final(bad.job_id)
        assert final["state"] == "failed" and "outside this host's volume roots" in final["reason"]
    assert agent.containers_left(console) == []


def test_a_missing_image_that_cannot_be_pulled_fails_the_job(agent: Agent, console: Console) -> None:
    dispatch = agent.dispatch("registry.invalid/nothing/here:1", ["true"])
    agent.runner.start(dispatch)
    final = console.wait_final(dispatch.job_id, timeout=180)
    assert final["state"] == "failed" and final["reason"].startswith("image not found: registry.invalid/nothing")
    assert "[agent] pulling registry.invalid/nothing/here:1" in console.log(dispatch.job_id)


@pytest.mark.integration
def test_a_job_past_its_memory_limit_fails_out_of_memory(agent: Agent, console: Console, base_image: str) -> None:
    dispatch = agent.dispatch(base_image, ["python3", "-c", "x = bytearray(600 * 2**20); print('survived')"],
                              memory_gb=0.25)
    agent.runner.start(dispatch)
    final = console.wait_final(dispatch.job_id)
    assert final["state"] == "failed", console.log(dispatch.job_id)
    assert final["reason"] == "out of memory: the job exceeded its memory limit of 0.25 GB"
    assert "survived" not in console.log(dispatch.job_id).splitlines()
    assert agent.containers_left(console) == []


def wait_ready(console: Console, job_id: int) -> None:
    console.wait(lambda: "ready" in console.log(job_id).splitlines(), timeout=60, what=f"job {job_id} to start")


@pytest.mark.integration
def test_cancel_and_time_limit_leave_no_container_and_no_process(agent: Agent, console: Console,
                                                                 base_image: str) -> None:
    # A job that ignores SIGTERM: killed after the grace period.
    stubborn = agent.dispatch(base_image, ["python3", "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                                            "signal.SIG_IGN); print('ready', flush=True); "
                                                            "time.sleep(600)"])
    agent.runner.start(stubborn)
    wait_ready(console, stubborn.job_id)
    assert job_processes() and agent.containers()
    agent.runner.stop(stubborn.job_id, 1, "cancelled by a user")
    final = console.wait_final(stubborn.job_id)
    assert final["state"] == "stopped" and final["reason"].startswith("cancelled by a user")
    limited = agent.dispatch(base_image, ["python3", "-c", "import time; print('ready', flush=True); time.sleep(600)"],
                             time_limit_s=3)
    agent.runner.start(limited)
    final = console.wait_final(limited.job_id)
    assert final["state"] == "failed" and final["reason"].startswith("time limit of 0.05 minutes exceeded")
    assert agent.containers_left(console) == [] and job_processes() == []


@pytest.mark.integration
def test_preemption_reaches_the_job_which_checkpoints(agent: Agent, console: Console, base_image: str) -> None:
    dispatch = agent.dispatch(base_image, ["python3", "-c", TERM_SCRIPT])
    agent.runner.start(dispatch)
    wait_ready(console, dispatch.job_id)
    agent.runner.stop(dispatch.job_id, 1, "preempted by an urgent job", state="preempted")
    final = console.wait_final(dispatch.job_id)
    assert final["state"] == "preempted" and "checkpointed" in console.log(dispatch.job_id)
    checkpoint = agent.runner.artifacts_root / str(dispatch.job_id) / "checkpoints" / "ckpt"
    assert checkpoint.read_text() == "step 7"
    assert agent.containers_left(console) == [] and job_processes() == []


@pytest.mark.integration
def test_kill_9_of_the_agent_leaves_no_container_and_no_process(agent: Agent, console: Console, base_image: str,
                                                                 tmp_path: Path) -> None:
    dispatch = agent.dispatch(base_image, ["python3", "-c", "import time; print('ready', flush=True); time.sleep(600)"])
    process = subprocess.Popen([sys.executable, "-m", "tests.containers.agent_process", console.url,
                                str(tmp_path / "killed"), __import__("json").dumps(dispatch.to_message()),
                                agent.cli],
                               stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "started"
        wait_ready(console, dispatch.job_id)
        assert agent.containers() and job_processes()
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        console.wait(lambda: not agent.containers() and not job_processes(), timeout=60,
                     what="the container and its processes to go")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.integration
def test_ddp_job_with_two_simulated_gpus_runs_torchrun_in_the_image(agent: Agent, console: Console,
                                                                    torch_image: str) -> None:
    script = ("import os, torch, torch.distributed as dist\n"
              "dist.init_process_group('gloo')\n"
              "t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)\n"
              "os.write(1, f'rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()} '\n"
              "         f'cvd {os.environ[\"CUDA_VISIBLE_DEVICES\"]}\\n'.encode())  # one write: ranks share a pipe\n"
              "dist.destroy_process_group()\n")
    first = agent.dispatch(torch_image, ["python", "train.py"])
    dispatch = agent.dispatch(torch_image, ["python", "train.py"], gpu_indices=(2, 3), multi_process=True,
                              preset="ddp", job_token=first.job_token,
                              container=upload(console, first.job_token, {"train.py": script}))
    agent.runner.start(dispatch)
    final = console.wait_final(dispatch.job_id, timeout=300)
    log = console.log(dispatch.job_id)
    assert final["state"] == "succeeded", log
    assert "python3 -m torch.distributed.run --nproc-per-node 2 --standalone" in log
    assert "rank 0 of 2 sum 3.0 cvd 0,1" in log and "rank 1 of 2 sum 3.0 cvd 0,1" in log
    assert agent.containers_left(console) == []


def test_leftover_containers_of_the_host_are_removed_and_images_listed(agent: Agent, base_image: str) -> None:
    runtime = agent.runner.containers
    assert runtime is not None
    for name in ("a", "b"):
        subprocess.run([agent.cli, "create", "--name", f"leftover-{agent.host}-{name}", "--label",
                        f"gpu-console.host={agent.host}", base_image, "true"], check=True, capture_output=True)
    other = subprocess.run([agent.cli, "create", "--label", "gpu-console.host=someone-else", base_image, "true"],
                           check=True, capture_output=True, text=True).stdout.strip()
    try:
        assert sorted(runtime.remove_leftovers(agent.host)) == [f"leftover-{agent.host}-a", f"leftover-{agent.host}-b"]
        assert agent.containers() == []
        assert subprocess.run([agent.cli, "container", "inspect", other], capture_output=True).returncode == 0
    finally:
        subprocess.run([agent.cli, "rm", "-f", other], capture_output=True)
    listed = {record.name: record for record in runtime.images()}
    assert listed[base_image].id and listed[base_image].size_mb > 10 and listed[base_image].created


def test_an_agent_without_a_container_runtime_fails_a_job_that_names_an_image(
        agent: Agent, console: Console, base_image: str) -> None:
    agent.runner.containers = None
    dispatch = agent.dispatch(base_image, ["true"])
    agent.runner.start(dispatch)
    final = console.wait_final(dispatch.job_id)
    assert final["state"] == "failed"
    assert final["reason"] == f"this host runs jobs as processes (gpu-agent --runtime process): it cannot run the image {base_image}"
    assert console.statuses[dispatch.job_id][0]["details"]["backend"] == "process"


@pytest.mark.integration
def test_a_builtin_ddp_preset_runs_from_the_mounted_runtime_with_progress_and_outputs(
        agent: Agent, console: Console, torch_image: str) -> None:
    dispatch = agent.dispatch(torch_image, [], preset="ddp", multi_process=True, gpu_indices=(0, 1), max_steps=4,
                              workload={"builtin": "tiny-lm", "params": {"batch_size": 8, "d_model": 32,
                                                                        "layers": 1, "seq_len": 16}})
    agent.runner.start(dispatch)
    final = console.wait_final(dispatch.job_id, timeout=300)
    assert final["state"] == "succeeded", console.log(dispatch.job_id)
    assert "python3 -m torch.distributed.run --nproc-per-node 2 --standalone -m workers.runtime.run_builtin" in \
        console.log(dispatch.job_id)
    records = console.progress[dispatch.job_id]
    assert [r for r in records if r.get("type") == "progress"][-1]["step"] == 4
    assert records[-1]["type"] == "result" and records[-1]["steps_per_s"] > 0  # the run's figures, forwarded
    outputs = agent.runner.artifacts_root / str(dispatch.job_id) / "outputs"
    assert any(outputs.iterdir())
    assert agent.containers_left(console) == []


@pytest.mark.integration
def test_a_gang_job_rendezvouses_across_two_agents_on_the_host_network(
        agent: Agent, console: Console, torch_image: str, tmp_path: Path) -> None:
    from tests.integration.live import free_port
    from workers.agent.client import ConsoleClient
    from workers.agent.containers import ContainerRuntime
    from workers.agent.runner import JobRunner, JobUids
    from workers.protocol import Rendezvous

    second = JobRunner(ConsoleClient(console.url, "host-token"), work_root=tmp_path / "work2",
                       artifacts_root=agent.runner.artifacts_root, simulated=True, job_uids=JobUids(*JOB_UIDS),
                       console_url=console.url, address="127.0.0.2",
                       containers=ContainerRuntime(agent.cli, oci_runtime=agent.runner.containers.oci_runtime,  # type: ignore[union-attr]
                                                   simulated=True))
    # Two addresses, as two hosts have: c10d tells nodes apart by address and pid, and both containers' torchrun
    # have the same pid.
    agent.runner.address = "127.0.0.1"
    script = ("import os, torch, torch.distributed as dist\n"
              "dist.init_process_group('gloo')\n"
              "t = torch.tensor([1.0]); dist.all_reduce(t)\n"
              "os.write(1, f'rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()}\\n'.encode())\n"
              # as a well-behaved script ends: without it gloo's threads may abort the process at exit
              # ("terminate called without an active exception", seen once under load)
              "dist.barrier(); dist.destroy_process_group()\n")
    token = agent.dispatch(torch_image, []).job_token
    code = upload(console, token, {"train.py": script})
    endpoint, run_id = f"127.0.0.1:{free_port()}", "gang-test"
    node0 = agent.dispatch(torch_image, ["python", "train.py"], multi_process=True, job_token=token, container=code,
                           rendezvous=Rendezvous(endpoint, 2, 0, run_id))
    node1 = replace(node0, host=f"{agent.host}-b", rendezvous=Rendezvous(endpoint, 2, 1, run_id))
    try:
        agent.runner.start(node0)
        second.start(node1)
        console.wait(lambda: len([s for s in console.statuses.get(node0.job_id, []) if s["state"] != "running"]) == 2,
                     timeout=300, what="both nodes to end")
        ends = [s for s in console.statuses[node0.job_id] if s["state"] != "running"]
        log = console.log(node0.job_id)
        assert [s["state"] for s in ends] == ["succeeded", "succeeded"], log
        assert "rank 0 of 2 sum 2.0" in log and "rank 1 of 2 sum 2.0" in log
        assert "--network host" not in log  # the agent's flags stay out of the job's log
    finally:
        second.shutdown()
        second.containers.remove_leftovers(f"{agent.host}-b")  # type: ignore[union-attr]


def test_a_job_stopped_while_its_image_is_pulled_ends_stopped(agent: Agent, console: Console) -> None:
    import socket

    with socket.socket() as registry:  # accepts and never answers: the pull hangs in its TLS handshake
        registry.bind(("127.0.0.1", 0))
        registry.listen(8)
        image = f"127.0.0.1:{registry.getsockname()[1]}/hangs/forever:1"
        dispatch = agent.dispatch(image, ["true"])
        agent.runner.start(dispatch)
        console.wait(lambda: f"[agent] pulling {image} ..." in console.log(dispatch.job_id), timeout=60,
                     what="the pull to start")
        agent.runner.stop(dispatch.job_id, 1, "cancelled by a user")
        final = console.wait_final(dispatch.job_id, timeout=120)
    assert (final["state"], final["reason"]) == ("stopped", "cancelled by a user")
    assert agent.containers_left(console) == []


HOSTILE = """\
import os, socket, sys
def attempt(what, action):
    try:
        action()
        print('ALLOWED', what, flush=True)
    except Exception as exc:
        print('refused', what, type(exc).__name__, flush=True)
attempt('host files', lambda: open(sys.argv[1]).read())
attempt('console network', lambda: socket.create_connection(('127.0.0.1', int(sys.argv[2])), timeout=3))
attempt('runtime write', lambda: open('/opt/gpu-console-runtime/workers/protocol.py', 'a').write('x'))
attempt('root', lambda: os.setuid(0))
attempt('chown', lambda: os.chown('/workspace/home', 0, 0))
attempt('mknod', lambda: os.mknod('/workspace/home/dev', 0o600 | 0o20000, os.makedev(1, 3)))
attempt('mount', lambda: __import__('ctypes').CDLL(None, use_errno=True).mount(b'none', b'/mnt', b'tmpfs', 0, None)
        == 0 or (_ for _ in ()).throw(OSError('mount failed')))
print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), flush=True)
"""


def test_a_hostile_job_in_its_container_reaches_nothing_of_the_host(agent: Agent, console: Console,
                                                                   base_image: str) -> None:
    token = agent.runner.work_root.parent / "host-token"
    token.write_text("agent-secret-token")
    port = int(console.url.rsplit(":", 1)[1])
    dispatch = agent.dispatch(base_image, ["python3", "-c", HOSTILE, str(token), str(port)])
    agent.runner.start(dispatch)
    assert console.wait_final(dispatch.job_id)["state"] == "succeeded", console.log(dispatch.job_id)
    log = console.log(dispatch.job_id)
    assert not [line for line in log.splitlines() if line.startswith("ALLOWED")], log
    for what in ("host files", "console network", "runtime write", "root", "chown", "mknod", "mount"):
        assert f"refused {what} " in log, log
    pids = eval(re.search(r"^pids (\[.*\])$", log, re.M).group(1))  # noqa: S307 - a list of ints it printed
    assert pids[0] == 1 and len(pids) <= 3  # its own PID namespace: catatonit, the job (and its listing)


def test_a_replica_from_an_image_serves_only_through_its_gate(agent: Agent, console: Console,
                                                              base_image: str) -> None:
    if agent.cli == "docker":
        pytest.skip("services from an image run on podman hosts only (docs/containers.md): the gate reads the "
                    "container's pid from podman's --pidfile")
    secret = "replica-secret-0123456789"
    dispatch = agent.dispatch(base_image, [], kind="inference", replica_secret=secret,
                              workload={"serve": {"command": ["python3", "-c", SERVER]}},
                              container={"env": {"MODEL": "tiny"}})
    assert agent.runner.start(dispatch) == "started"

    def announced() -> dict | None:
        return next((p for p in console.progress.get(dispatch.job_id, []) if p.get("type") == "serving"), None)

    console.wait(lambda: announced() or console.final(dispatch.job_id), timeout=120,
                 what="the gate to announce the server")
    serving = announced()
    assert serving is not None, console.log(dispatch.job_id)
    url = f"http://127.0.0.1:{serving['port']}"
    answer = httpx.post(f"{url}/predict", json={"inputs": [[1, 2], [3]]},
                        headers={REPLICA_SECRET_HEADER: secret}, timeout=10)
    assert answer.status_code == 200 and answer.json() == {"outputs": [3, 3], "model": "tiny",
                                                           "secret_seen": False}
    assert httpx.post(f"{url}/predict", json={"inputs": [[1]]}, timeout=10).status_code == 401
    assert httpx.get(f"{url}/health", headers={REPLICA_SECRET_HEADER: secret}, timeout=10).json() == {"ready": True}
    stats = httpx.get(f"{url}/stats", headers={REPLICA_SECRET_HEADER: secret}, timeout=10).json()
    assert stats["requests"] == 1 and stats["errors"] == 0 and stats["latency_ms"]["p95"] is not None
    (name,) = agent.containers()
    network = subprocess.run([agent.cli, "inspect", "--format", "{{.HostConfig.NetworkMode}}", name],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert network == "none"  # the server is reached through the gate alone, inside its namespace
    gate = [pid for pid in job_processes() if b"workers.agent.replica_gate" in Path(f"/proc/{pid}/cmdline")
            .read_bytes()]
    assert gate, "the gate serves under the job's uid, not root"
    agent.runner.stop(dispatch.job_id, dispatch.attempt, "service scaled down")
    assert console.wait_final(dispatch.job_id)["state"] == "stopped"
    assert agent.containers_left(console) == [] and job_processes() == []  # the end is reported before cleanup
