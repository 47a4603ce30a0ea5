"""Jobs that misbehave, run by a real agent with --run-as nobody --job-uids: each job runs under an unprivileged
uid of its own (nobody's groups) in a private work directory, cannot snoop on another job's files or processes,
cannot leave a daemon behind, cannot flood the log store, and cannot break its log with binary output.

The agent must run as root to switch users: the tests that need it skip otherwise. Jobs use the system Python
(/usr/bin/python3), which `nobody` can execute, unlike a virtual environment under /root.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.live import LiveCluster, create_team, gone
from workers.agent import main as agent_main
from workers.agent.runner import JobUids, RunAs, resolve_run_as

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]
PROBE = Path(__file__).resolve().parents[1] / "integration" / "scripts" / "isolation_probe.py"
SYSTEM_PYTHON = "/usr/bin/python3"
CONSOLE_LOG_CAP = 6_000_000  # characters the console stores per job
AGENT_LOG_CAP = 8_000_000  # characters the agent keeps and forwards per job attempt
JOB_UIDS = range(3_900_000, 3_900_100)  # the agent's --job-uids: no account uses them

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching a job to another user needs root")


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


NOBODY = _nobody()
needs_nobody = pytest.mark.skipif(NOBODY is None or not os.access(SYSTEM_PYTHON, os.X_OK),
                                  reason="needs the user nobody and /usr/bin/python3")


# --- start-up checks of the option (no cluster)


def test_run_as_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match=r"--run-as nobody \(CONSOLE_AGENT_RUN_AS\) needs the agent to run as root"):
        agent_main.main(["--run-as", "nobody", "--simulate", "1xH200"])


def test_run_as_from_the_environment(monkeypatch):
    monkeypatch.setenv("CONSOLE_AGENT_RUN_AS", "nobody")
    assert agent_main.parse_args([]).run_as == "nobody"
    monkeypatch.delenv("CONSOLE_AGENT_RUN_AS")
    assert agent_main.parse_args([]).run_as is None


def test_a_root_agent_gives_each_job_a_uid_of_its_own_by_default(monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    uids = agent_main.resolve_job_uids(None, None)
    assert f"{uids.first}-{uids.last}" == agent_main.DEFAULT_JOB_UIDS
    assert "a uid of its own" in agent_main.describe_isolation(None, uids)
    # --run-as alone: the one user it names; 'off': the agent's own user, with a warning for root.
    assert agent_main.resolve_job_uids(None, RunAs("nobody", 65534, 65534, ())) is None
    with caplog.at_level(logging.WARNING, logger="workers.agent"):
        assert agent_main.resolve_job_uids("off", None) is None
    assert any("jobs run as root" in r.message for r in caplog.records)
    # An agent that cannot switch users says so plainly.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert agent_main.resolve_job_uids(None, None) is None
    assert "share the agent's user (uid 1000)" in agent_main.describe_isolation(None, None)
    assert resolve_run_as(None) is None
    with pytest.raises(SystemExit, match="needs the agent to run as root"):
        agent_main.resolve_job_uids("3900000-3900009", None)


@needs_root
def test_run_as_refuses_unknown_and_root_users():
    with pytest.raises(SystemExit, match="no such user"):
        resolve_run_as("no-such-user-here-42")
    with pytest.raises(SystemExit, match="unprivileged"):
        resolve_run_as("root")


def test_job_uids_are_handed_out_round_robin_and_given_back():
    uids = JobUids(100_000, 100_002)
    assert [uids.take(), uids.take()] == [100_000, 100_001]
    uids.give_back(100_000)
    assert uids.take() == 100_002  # the latest given back is reused last
    assert uids.take() == 100_000
    with pytest.raises(OSError, match="all 3 job uids are in use"):
        uids.take()


def test_job_uids_refuse_bad_ranges_and_ranges_holding_accounts():
    for text in ("abc", "5", "10-5", "0-10"):
        with pytest.raises(SystemExit, match="--job-uids"):
            JobUids.parse(text)
    account = next(entry for entry in pwd.getpwall() if entry.pw_uid > 0)
    with pytest.raises(SystemExit, match=f"holds the accounts .*{account.pw_name}"):
        JobUids.parse(f"{account.pw_uid}-{account.pw_uid}")
    assert JobUids.parse(f"{JOB_UIDS.start}-{JOB_UIDS.stop - 1}").first == JOB_UIDS.start




# --- a real console and an agent with --run-as nobody


@dataclass
class RunAsCluster(LiveCluster):
    agent_args: list[str] = field(default_factory=list)

    def _spawn(self, name, argv):
        if name.startswith("agent-"):
            argv = [*argv, *self.agent_args]  # argparse: the last --work-dir wins
        return super()._spawn(name, argv)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0 or NOBODY is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs root, the user nobody and /usr/bin/python3")
    # pytest's own temp folders are 0700: nobody could not reach a work dir there.
    outside = Path(tempfile.mkdtemp(prefix="job-isolation-", dir="/tmp"))
    outside.chmod(0o711)
    live = RunAsCluster(tmp_path_factory.mktemp("cluster"), agents={"iso": "2xH200"},
                        extra_env={"CONSOLE_JOB_LOG_MAX_CHARS": str(CONSOLE_LOG_CAP),
                                   "GPU_AGENT_LOG_MAX_CHARS": str(AGENT_LOG_CAP),
                                   "CONSOLE_ARTIFACTS": (outside / "artifacts").as_uri()},
                        agent_args=["--run-as", "nobody", "--job-uids", f"{JOB_UIDS.start}-{JOB_UIDS.stop - 1}",
                                    "--work-dir", str(outside / "work"),
                                    "--artifacts", str(outside / "artifacts")])
    live.work_root, live.artifacts = outside / "work", outside / "artifacts"
    try:
        live.start()
        admin = live.admin()
        create_team(admin, "it", 8)
        yield live
    finally:
        live.stop()
        shutil.rmtree(outside, ignore_errors=True)


def probe(cluster: RunAsCluster, *args: str) -> dict:
    return cluster.submit(gpus=1, gpu_type="H200", workload={"command": [SYSTEM_PYTHON, str(PROBE), *args]})


def log_head(cluster: RunAsCluster, job_id: int) -> str:
    """The start of a job's log, chunks of up to a million characters included (LiveCluster.log stops short)."""
    return cluster.admin().get(f"/api/v1/jobs/{job_id}/logs/", params={"after": 0, "limit": 1_000_000}).json()["data"]


def wait_line(cluster: RunAsCluster, job_id: int, pattern: str) -> re.Match:
    return cluster.wait_for(lambda: re.search(pattern, log_head(cluster, job_id), re.M), timeout=60,
                            what=f"job {job_id} to print {pattern!r}")


def cancel(cluster: RunAsCluster, job_id: int) -> None:
    assert cluster.admin().post(f"/api/v1/jobs/{job_id}/cancel/", json={}).status_code == 200
    cluster.wait_state(job_id, {"cancelled"}, timeout=30)


def full_log(cluster: RunAsCluster, job_id: int) -> tuple[str, dict]:
    parts, after = [], 0
    while True:
        response = cluster.admin().get(f"/api/v1/jobs/{job_id}/logs/", params={"after": after, "limit": 1_000_000})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json")
        page = response.json()
        parts.append(page["data"])
        if page["next"] == after:
            return "".join(parts), page
        after = page["next"]


def test_job_runs_under_its_own_uid_in_a_private_dir(cluster):
    job = probe(cluster, "identity", "0")
    done = cluster.wait_state(job["id"], {"succeeded", "failed"})
    log = cluster.log(job["id"])
    assert done["state"] == "succeeded", log
    found = dict(re.findall(r"(\w+)=(\S+)", re.search(r"^identity .*$", log, re.M).group(0)))
    # A uid of its own with a private group of the same number; nobody's groups (device access) besides.
    assert int(found["uid"]) in JOB_UIDS and int(found["gid"]) == int(found["uid"]), log
    assert {int(g) for g in found["groups"].split(",")} == set(os.getgrouplist("nobody", NOBODY.pw_gid))
    assert found["home"] == found["cwd"]
    home = Path(found["cwd"])
    attempt = cluster.work_root / f"job-{job['id']}" / "attempt-1"
    assert home.parent == attempt and home.name.startswith("work-")
    # The folders above it: the agent's alone (the job reaches its folder through its own filesystem view);
    # the agent's files of the job: 0600.
    for folder in (cluster.work_root, attempt.parent, attempt):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.geteuid()
    for name in ("output.log", "command.json", "view.json"):
        assert stat.S_IMODE((attempt / name).stat().st_mode) == 0o600
    # What the agent reads of the job still arrives: its log, its progress file; the job's outputs are stored.
    assert "identity uid=" in (attempt / "output.log").read_text()
    assert done["steps_done"] == 7
    artifacts = {a["path"] for a in cluster.admin().get(f"/api/v1/jobs/{job['id']}/artifacts/").json()}
    assert {"outputs/hello.txt", "logs/attempt-1-node-0.log"} <= artifacts, artifacts
    # Once it ended, the agent took its files back before reporting: the uid can go to another job.
    outputs = cluster.artifacts / str(job["id"]) / "outputs"
    for path in (home, home / "secret.txt", home / "tmp", outputs, outputs / "hello.txt"):
        assert path.stat().st_uid == os.geteuid(), path
    # Its home is the agent's alone; its artifacts the agent's too, readable by the store's group (the console's).
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and stat.S_IMODE(outputs.stat().st_mode) == 0o2750
    assert stat.S_IMODE((outputs / "hello.txt").stat().st_mode) == 0o640
    # The stored log, and the folders above it: the agent's, readable by the store's group only.
    logs = cluster.artifacts / str(job["id"]) / "logs"
    for folder in (logs.parent, logs):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2750, folder
    assert stat.S_IMODE((logs / "attempt-1-node-0.log").stat().st_mode) == 0o640


def test_job_cannot_list_read_or_signal_another_jobs_files_and_processes(cluster):
    victim = probe(cluster, "identity", "600")
    found = wait_line(cluster, victim["id"], r"^identity uid=(\d+) .* cwd=(\S+) pid=(\d+)")
    victim_uid, home, pid = int(found.group(1)), Path(found.group(2)), found.group(3)
    info = home.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == victim_uid, oct(info.st_mode)
    assert (home / "secret.txt").stat().st_uid == victim_uid
    attempt = cluster.work_root / f"job-{victim['id']}" / "attempt-1"
    targets = [cluster.work_root, attempt.parent, attempt, attempt / "output.log", attempt / "command.json",
               cluster.artifacts / str(victim["id"]) / "outputs",
               # Under one shared uid these would reach the victim's folder and process:
               f"/proc/{pid}/cwd", f"/proc/{pid}/cwd/secret.txt", f"pid:{pid}"]
    snooper = probe(cluster, "snoop", *map(str, targets))
    done = cluster.wait_state(snooper["id"], {"succeeded", "failed"})
    log = cluster.log(snooper["id"])
    assert done["state"] == "succeeded", log
    for target in targets:  # refused, or not even there in the snooper's own view of the files
        assert re.search(rf"^snoop {re.escape(str(target))} (PermissionError|FileNotFoundError)$", log, re.M), log
    # The victim's own folder: reachable only by a name the snooper has no way to list.
    assert (home / "secret.txt").exists() and str(home) not in log
    cancel(cluster, victim["id"])


@pytest.mark.parametrize("mode", ["exit", "stay"])
def test_daemon_of_a_job_dies_with_it(cluster, mode):
    job = probe(cluster, "daemon", mode)
    found = wait_line(cluster, job["id"], r"^daemon pid=(\d+)")
    pid = int(found.group(1))
    # The job, running as nobody, cannot kill the shim that reaps its daemons.
    assert wait_line(cluster, job["id"], r"^kill-shim (\S+)").group(1) == "PermissionError"
    if mode == "stay":
        assert not gone(pid)
        assert Path(f"/proc/{pid}").stat().st_uid in JOB_UIDS
        cancel(cluster, job["id"])
    else:
        assert cluster.wait_state(job["id"], {"succeeded", "failed"})["state"] == "succeeded"
    cluster.wait_for(lambda: gone(pid), timeout=60, what=f"the daemon {pid} to be killed")


def test_flooding_job_keeps_running_with_its_log_capped(cluster):
    job = probe(cluster, "flood")
    home = Path(wait_line(cluster, job["id"], r"^flood cwd=(\S+)").group(1))
    local = cluster.work_root / f"job-{job['id']}" / "attempt-1" / "output.log"
    cluster.wait_for(lambda: full_log_page(cluster, job["id"])["truncated"], timeout=60,
                     what="the console to cap the job's log")
    # The agent keeps draining the job's output past both caps: the job is not blocked on a full pipe.
    cluster.wait_for(lambda: local.stat().st_size >= AGENT_LOG_CAP, timeout=60, what="the agent's cap")
    size = local.stat().st_size
    before = int((home / "count").read_text())
    # It keeps printing past both caps: 32 more blocks of 64 000 characters (a timeout only means it stalled).
    cluster.wait_for(lambda: int((home / "count").read_text()) > before + 16, timeout=60,
                     what="the job to keep printing past the caps")
    assert cluster.job(job["id"])["state"] == "running"
    assert local.stat().st_size == size <= AGENT_LOG_CAP + 200
    assert "output past 8000000 characters is dropped" in local.read_text()[-200:]
    stored, page = full_log(cluster, job["id"])
    assert page["truncated"] and len(stored) <= CONSOLE_LOG_CAP + 200
    assert stored.rstrip().endswith("the job keeps running]")
    cancel(cluster, job["id"])


def full_log_page(cluster: RunAsCluster, job_id: int) -> dict:
    return cluster.admin().get(f"/api/v1/jobs/{job_id}/logs/", params={"after": 0, "limit": 1}).json()


@pytest.mark.parametrize("code", [0, 3])
def test_binary_output_and_a_huge_line_keep_the_log_readable(cluster, code):
    job = probe(cluster, "garbage", str(code))
    done = cluster.wait_state(job["id"], {"succeeded", "failed"}, timeout=120)
    assert (done["state"], done["exit_code"]) == ("succeeded" if code == 0 else "failed", code)
    text, page = full_log(cluster, job["id"])
    assert not page["truncated"]
    assert "garbage start" in text and "garbage end" in text
    assert "\ufffd" in text and "\x00" not in text
    assert max(len(run) for run in re.findall(r"y{1000,}", text)) == 5_000_000
    assert f"[agent] {done['state']}:" in text
