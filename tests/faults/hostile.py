"""The hostile-jobs suite's cluster and probes, shared by its process set-ups (test_hostile_jobs.py) and its
container set-up (test_hostile_containers.py): a live console whose agent runs team red's hostile jobs
(scripts/hostile_job.py) next to a victim job of team blue, and the checks of what the probes printed.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.containers import images
from tests.containers.conftest import oci_runtime
from tests.integration.live import ADMIN_PASSWORD, LiveCluster, create_team
from workers.agent.containers import ContainerRuntime
from workers.agent.main import DEFAULT_JOB_UIDS
from workers.codepack import pack

PROBE = Path(__file__).resolve().parent / "scripts" / "hostile_job.py"
RECIPE_ENV = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "gpu-agent.env.example"
PY = sys.executable  # the virtual environment's Python: reached through the job's view, whatever folder holds it
MODES = ("make-run", "run-as", "systemd")
REFUSED = ("FileNotFoundError", "PermissionError", "NotADirectoryError", "IsADirectoryError")
# What a job's environment may hold: the agent's allow-list and what the agent sets for the job.
JOB_ENV = re.compile(r"^(PATH|LANG|LANGUAGE|TZ|TERM|PYTHONPATH|PYTHONHASHSEED|HOME|USER|LOGNAME|TMPDIR|PYTHONUNBUFFERED|"
                     r"CUDA_VISIBLE_DEVICES|LC_\w+|NCCL_\w+|GLOO_\w+|OMP_\w+|MKL_\w+|OPENBLAS_\w+|"
                     r"CONSOLE_(JOB_ID|ATTEMPT|PRESET|PROGRESS_FILE|CHECKPOINT_DIR|OUTPUT_DIR|JOB_TOKEN|API_URL|"
                     r"DEVICE|MAX_STEPS|GPU_MEMORY_LIMIT_MB|GPU_MEMORY_FRACTION))$")

PIDS_MAX = 200  # processes per job (the admin's GPU_AGENT_JOB_PIDS_MAX): a fork bomb stops there
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching a job to another user needs root")


@dataclass
class HostileCluster(LiveCluster):
    mode: str = "make-run"
    host: str = "red"
    agent_args: list[str] = field(default_factory=list)
    agent_env: dict[str, str] = field(default_factory=dict)
    image: str = ""  # the container set-up: jobs run the probe in this image, from a code snapshot per team
    snapshots: dict[str, str] = field(default_factory=dict)

    def _spawn(self, name, argv):
        if name.startswith("agent-"):
            argv = [*argv, *self.agent_args]  # argparse: the last --work-dir, --token-file... win
            saved = self.env
            self.env = {**saved, "GPU_AGENT_JOB_PIDS_MAX": str(PIDS_MAX), **self.agent_env}
            try:
                return super()._spawn(name, argv)
            finally:
                self.env = saved
        return super()._spawn(name, argv)

    def setup(self) -> None:
        super().setup()
        if self.mode == "systemd":  # the token where an admin copies it for the recipe
            shutil.copy(self.base / "var" / f"token-{self.host}", self.token_file)
            self.token_file.chmod(0o600)

    def submit_to(self, team: str, **spec) -> dict:
        response = self.admin().post("/api/v1/jobs/", json={"team": team, "name": f"{team}-job", "gpus": 1, **spec})
        assert response.status_code == 201, response.text
        return response.json()

    @property
    def work_root(self) -> Path:
        return Path(self.agent_env.get("GPU_AGENT_WORK_DIR") or self.base / "work" / self.host)

    @property
    def artifacts(self) -> Path:
        return Path(self.agent_env.get("CONSOLE_ARTIFACTS") or self.base / "artifacts")

    @property
    def token_file(self) -> Path:
        return Path(self.agent_env.get("GPU_AGENT_TOKEN_FILE") or self.base / "var" / f"token-{self.host}")

    def probe(self, team: str, *words: str) -> dict:
        """The spec of a job of `team` that runs the probe with `words`: on the host, or in the image."""
        if not self.image:
            return {"workload": {"command": [PY, str(PROBE), *words]}}
        return {"image": self.image, "code": {"snapshot": self.snapshots[team]},
                "workload": {"command": ["python3", PROBE.name, *words]}}

    def upload_probe(self, team: str) -> None:
        """The probe script as a code snapshot of `team` (a container job's code is unpacked at its workdir)."""
        folder = self.base / "probe-code"
        folder.mkdir(exist_ok=True)
        shutil.copy(PROBE, folder / PROBE.name)
        packed = pack(folder)
        try:
            with packed.path.open("rb") as archive:
                response = self.admin().post("/api/v1/code-snapshots/", data={"team": team},
                                             files={"archive": ("code.tar.gz", archive, "application/gzip")})
        finally:
            packed.discard()
        assert response.status_code == 201, response.text
        self.snapshots[team] = response.json()["id"]

    def container_pid(self, job_id: int) -> int:
        """The host pid of a container job's first process (podman's view)."""
        name = f"gpu-console-{self.host}-job-{job_id}-1"
        found = subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True,
                               text=True, check=True, timeout=120)
        return int(found.stdout.strip())


def setup_cluster(mode: str, base: Path) -> HostileCluster:
    var = base / "var"
    if mode == "podman":  # a host name of its own: an agent removes every container of its name at start
        host = f"red-{uuid.uuid4().hex[:8]}"
        return HostileCluster(base, agents={host: "4xH200"}, mode=mode, host=host, image=images.BASE_IMAGE,
                              extra_env={"GPU_AGENT_RUNTIME": "podman", "GPU_AGENT_OCI_RUNTIME": oci_runtime()})
    if mode == "make-run":
        return HostileCluster(base, agents={"red": "4xH200"}, mode=mode, agent_args=["--private", str(var)])
    if mode == "run-as":
        return HostileCluster(base, agents={"red": "4xH200"}, mode=mode,
                              agent_args=["--run-as", "nobody", "--job-uids", "3910000-3910099"])
    # The systemd recipe: its agent.env as shipped, with this machine's paths and addresses.
    etc, state, shared = base / "etc" / "gpu-agent", base / "var-lib-gpu-agent", base / "shared" / "artifacts"
    etc.mkdir(parents=True)
    etc.chmod(0o700)
    places = {"/etc/gpu-agent": str(etc), "/var/lib/gpu-agent": str(state), "/shared/gpu-console/artifacts": str(shared)}
    recipe = {}
    for line in RECIPE_ENV.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            for place, here in places.items():
                value = here + value[len(place):] if value == place or value.startswith(place + "/") else value
            recipe[name] = value
    # Where the console and broker are is the harness's (--console-url, --broker); this host is 127.0.0.1.
    for name in ("GPU_AGENT_CONSOLE_URL", "CELERY_BROKER_URL"):
        recipe.pop(name, None)
    recipe.update(GPU_AGENT_NAME="red", GPU_AGENT_ADDRESS="127.0.0.1", NCCL_SOCKET_IFNAME="lo", GLOO_SOCKET_IFNAME="lo")
    # Job uids of its own: the make-run set-up's agent (the same default range as the recipe's) may run beside it,
    # on another xdist worker, and two agents handing out the same uids would see each other's jobs.
    assert recipe["GPU_AGENT_JOB_UIDS"] == DEFAULT_JOB_UIDS
    recipe["GPU_AGENT_JOB_UIDS"] = "1620000000-1620009999"
    assert recipe["GPU_AGENT_TOKEN_FILE"] == str(etc / "token") and recipe["GPU_AGENT_WORK_DIR"] == str(state)
    cluster = HostileCluster(base, agents={"red": "4xH200"}, mode=mode,
                             extra_env={"CONSOLE_ARTIFACTS": shared.as_uri()}, agent_env=recipe)
    # The options the recipe sets by environment: the harness's flags for them give way.
    cluster.agent_args = ["--token-file", str(etc / "token"), "--work-dir", str(state), "--artifacts", str(shared)]
    return cluster


def hostile_cluster_fixture(mode: str):
    """A module's `cluster` fixture: the hostile cluster in one agent set-up (MODES), skipped unless root."""

    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory):
        if os.geteuid() != 0:
            pytest.skip("the agent must run as root to give jobs users of their own")
        yield from hostile_cluster(mode, tmp_path_factory.mktemp(f"hostile-{mode}"))

    return cluster


def hostile_cluster(mode: str, base: Path):
    live = setup_cluster(mode, base)
    try:
        live.start()
        admin = live.admin()
        create_team(admin, "red", 8)
        create_team(admin, "blue", 8)
        if live.image:
            live.upload_probe("red")
            live.upload_probe("blue")
        live.victim_secret = f"blue-secret-{secrets.token_hex(8)}"
        extra = {}
        if live.image:  # also a team secret of blue's: its agent fetches it for the container, its log masks it
            created = admin.post("/api/v1/teams/blue/secrets/", json={"name": "BLUE_TOKEN", "value": live.victim_secret})
            assert created.status_code == 201, created.text
            extra = {"secrets": ["BLUE_TOKEN"]}
        live.victim = live.submit_to("blue", **live.probe("blue", "secret", live.victim_secret, "900"), **extra)
        found = live.wait_for(lambda: re.search(r"^victim home=(\S+) pid=(\d+)", live.log(live.victim["id"]),
                                                re.M), timeout=90, what="the victim job to start")
        live.victim_home, live.victim_pid = Path(found.group(1)), int(found.group(2))
        if live.image:  # what the victim printed is its container's view: its folder and pid on the host
            live.victim_home = live.work_root / f"job-{live.victim['id']}" / "attempt-1" / "code"
            live.victim_pid = live.container_pid(live.victim["id"])
        yield live
    finally:
        live.stop()
        if live.image:  # a container the agent had no time to remove before the harness killed it (10 s)
            ContainerRuntime("podman").remove_leftovers(live.host)


def run_probe(cluster: HostileCluster, *words: str, team: str = "red", **spec) -> tuple[dict, str]:
    job = cluster.submit_to(team, **cluster.probe(team, *words), **spec)
    done = cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=180)
    return done, cluster.admin().get(f"/api/v1/jobs/{job['id']}/logs/", params={"limit": 1_000_000}).json()["data"]


def attempts(log: str, what: str) -> dict[str, str]:
    return dict(re.findall(rf"^try {what} (\S+) -> (.*)$", log, re.M))


def secrets_of(cluster: HostileCluster) -> list[str]:
    values = [ADMIN_PASSWORD, cluster.admin_token, cluster.token_file.read_text().strip(), cluster.victim_secret]
    values += [cluster.env[name] for name in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")
               if cluster.env.get(name, "").startswith(("postgres", "redis"))]
    return values


def leak_targets(cluster: HostileCluster) -> list[str]:
    """Every file and folder of the agent, the console and team blue's job a hostile job tries to read."""
    victim_attempt = cluster.work_root / f"job-{cluster.victim['id']}" / "attempt-1"
    blue = cluster.artifacts / str(cluster.victim["id"])
    var = cluster.base / "var"
    targets = [cluster.token_file, var / "db.sqlite3", var / "broker", var / f"token-{cluster.host}", var,
               cluster.work_root, victim_attempt, victim_attempt / "output.log", victim_attempt / "command.json",
               cluster.victim_home, cluster.victim_home / "secret.txt", blue / "outputs",
               blue / "outputs" / "secret.txt", cluster.artifacts,
               f"/proc/{cluster.victim_pid}/environ", f"/proc/{cluster.victim_pid}/cwd/secret.txt"]
    return list(map(str, targets))


def check_nothing_leaked(cluster: HostileCluster, log: str, targets: list[str]) -> None:
    """What the env, read and creds probes printed: no secret, no file of another, no credential that works."""
    # Nothing secret in what the job could print: not the host token, the admin's password or token, the
    # database's or broker's URL, nor team blue's secret.
    for value in secrets_of(cluster):
        assert value not in log, f"{value!r} leaked into the job's log"
    # Its environment: the allow-list and what the agent set for it, nothing else of the agent's (in a
    # container, also what podman sets: `container`, HOSTNAME).
    names = re.findall(r"^env (\w+)=", log, re.M)
    allowed = (lambda name: JOB_ENV.match(name) or name in ("container", "HOSTNAME")) if cluster.image \
        else JOB_ENV.match
    assert "CONSOLE_JOB_TOKEN" in names and [n for n in names if not allowed(n)] == [], names
    # Every file and folder of the agent, the console and team blue: refused, or not there in its view.
    reads = attempts(log, "read")
    assert set(reads) == set(targets), reads
    for target, outcome in reads.items():
        assert outcome in REFUSED, f"{target}: {outcome}"
    # Every credential it found, against the agent and user APIs: refused. Its own token: its own job only. A
    # container job has no network (one host, no replica): it reaches no API at all.
    refused = {"URLError"} if cluster.image else {"401"}
    for what in ("agent-api", "user-api"):
        tried = attempts(log, what)
        assert tried and set(tried.values()) == refused, tried
    for what in ("own-job", "own-progress"):
        outcome = attempts(log, what)["job-api"]
        assert outcome == "URLError" if cluster.image else outcome.startswith("200 "), (what, outcome)
    for what in ("other-job", "other-artifacts", "other-report"):
        assert attempts(log, what)[str(cluster.victim["id"])] in refused, (what, log)
    assert attempts(log, "other-artifact-via-own")[str(cluster.victim["id"])] in (
        {"URLError"} if cluster.image else {"400", "404"})
    # Team blue's job ran on, untouched.
    victim = cluster.job(cluster.victim["id"])
    assert victim["state"] == "running" and victim["attempts"] == 1
    assert (cluster.victim_home / "secret.txt").read_text() == cluster.victim_secret


def check_links_not_followed(cluster: HostileCluster, done: dict, log: str) -> None:
    """What the swap probe did: its artifact folder stayed, and the console follows none of its links."""
    # Its artifact folder is a mount point in its view: it cannot be moved away and replaced by a link.
    assert attempts(log, "swap") and set(attempts(log, "swap").values()) <= {"OSError", "PermissionError"}, log
    admin = cluster.admin()
    listed = {a["path"] for a in admin.get(f"/api/v1/jobs/{done['id']}/artifacts/").json()}
    assert "outputs/own.txt" in listed
    assert not {"outputs/root-link", "outputs/passwd-link", "outputs/up-link"} & listed, listed
    for name in ("root-link", "passwd-link", "up-link", "root-link/etc/passwd", "up-link/" + str(cluster.victim["id"])):
        answer = admin.get(f"/api/v1/jobs/{done['id']}/artifacts/outputs/{name}", follow_redirects=True)
        assert answer.status_code == 404, name
    own = admin.get(f"/api/v1/jobs/{done['id']}/artifacts/outputs/own.txt", follow_redirects=True)
    assert own.content == b"the job's own output\n"
