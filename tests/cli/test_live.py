"""gpuctl against a real console: pytest-django's live server, the `world` teams, gpuctl run in-process."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from apps.accounts.models import ApiToken
from apps.jobs import services
from apps.jobs.models import Job, JobEvent
from tests.cli.conftest import PASSWORD
from workers.cli import follow
from workers.runtime.catalog import PRESETS, WORKLOADS

REPO = Path(__file__).resolve().parents[2]


def saved_token(config_file: Path) -> str:
    return json.loads(config_file.read_text())["token"]


# --- login and settings


def test_login_saves_a_private_config_and_the_token_works(live_server, world, gpuctl, config_file):
    result = gpuctl("login", "--url", live_server.url + "/", "--username", "mia", "--password-stdin",
                    "--token-name", "ci-runner", stdin=PASSWORD + "\n")
    assert result.code == 0, result.err
    assert "Logged in to" in result.out and "as mia" in result.out
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(config_file.parent.stat().st_mode) == 0o700
    config = json.loads(config_file.read_text())
    assert config["url"] == live_server.url and config["username"] == "mia"
    token = config["token"]
    assert token not in result.out + result.err  # shown only with --show-token
    assert ApiToken.objects.get(user=world.member).name == "ci-runner"

    listed = gpuctl("status")
    assert listed.code == 0, listed.err
    assert "No jobs" in listed.err
    assert ApiToken.objects.get(user=world.member).last_used_at is not None


def test_login_show_token_prints_it_once_on_stdout(live_server, world, gpuctl, config_file):
    result = gpuctl("login", "--url", live_server.url, "-u", "mia", "--password-stdin", "--show-token",
                    stdin=PASSWORD)
    assert result.code == 0, result.err
    assert result.out.strip() == saved_token(config_file)
    assert "Logged in" in result.err


def test_login_prompts_for_the_user_and_the_password(live_server, world, gpuctl, config_file, monkeypatch):
    prompts: list[str] = []

    def fake_getpass(prompt: str) -> str:
        prompts.append(prompt)
        return PASSWORD

    monkeypatch.setattr("getpass.getpass", fake_getpass)
    monkeypatch.setenv("GPUCTL_URL", live_server.url)
    result = gpuctl("login", stdin="mia\n")
    assert result.code == 0, result.err
    assert f"Username for {live_server.url}: " in result.err
    assert prompts == [f"Password for mia at {live_server.url}: "]
    assert json.loads(config_file.read_text())["username"] == "mia"


def test_login_with_a_wrong_password_exits_2(live_server, world, gpuctl, config_file):
    result = gpuctl("login", "--url", live_server.url, "-u", "mia", "--password-stdin", stdin="wrong\n")
    assert result.code == 2
    assert "login failed" in result.err and "wrong password" in result.err
    assert not config_file.exists()


def test_without_login_or_with_a_bad_token_it_says_to_log_in(live_server, world, gpuctl, monkeypatch):
    result = gpuctl("status")
    assert result.code == 1 and "gpuctl login" in result.err

    monkeypatch.setenv("GPUCTL_URL", live_server.url)
    monkeypatch.setenv("GPUCTL_TOKEN", "not-a-real-token")
    result = gpuctl("presets")
    assert result.code == 1
    assert "not logged in to " + live_server.url in result.err and "gpuctl login" in result.err


def test_environment_overrides_the_file(console, gpuctl, config_file, monkeypatch):
    token = saved_token(config_file)
    monkeypatch.setenv("GPUCTL_TOKEN", "revoked-or-bogus")
    assert gpuctl("presets").code == 1  # the variable wins over the saved (valid) token

    config_file.unlink()
    monkeypatch.setenv("GPUCTL_URL", console)
    monkeypatch.setenv("GPUCTL_TOKEN", token)
    assert gpuctl("presets").code == 0  # CI: no file at all


def test_connection_errors_name_the_url(gpuctl, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens there
    monkeypatch.setenv("GPUCTL_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("GPUCTL_TOKEN", "whatever")
    result = gpuctl("status")
    assert result.code == 1
    assert f"cannot reach the console at http://127.0.0.1:{port}" in result.err


def test_logout_revokes_the_token_and_removes_the_file(console, gpuctl, config_file, world):
    result = gpuctl("logout")
    assert result.code == 0, result.err
    assert not config_file.exists()
    assert ApiToken.objects.get(user=world.member).revoked_at is not None


# --- submit


def test_submit_from_flags(console, gpuctl, world):
    result = gpuctl("submit", "--name", "digits", "--team", "vision", "--gpus", "1", "--preset", "amp-bf16",
                    "--builtin", "mlp-digits", "--param", "epochs=1", "--param", "lr=0.01", "--max-steps", "100",
                    "--time-limit", "30", "--max-retries", "1")
    assert result.code == 0, result.err
    job = Job.objects.get()
    assert result.out.startswith(f"Submitted job {job.pk} (digits, team vision): queued")
    assert (job.name, job.team.slug, job.user, job.kind, job.gpus, job.preset) == (
        "digits", "vision", world.member, "train", 1, "amp-bf16")
    assert job.workload == {"builtin": "mlp-digits", "params": {"epochs": 1, "lr": 0.01}}
    assert (job.max_steps, job.time_limit_minutes, job.max_retries) == (100, 30, 1)


def test_submit_a_command_after_double_dash_or_with_command(console, gpuctl):
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "-q", "--", "python", "train.py", "--lr", "3e-4")
    assert result.code == 0, result.err
    job = Job.objects.get(pk=int(result.out))
    assert job.workload == {"command": ["python", "train.py", "--lr", "3e-4"]} and job.name == "python"

    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "-q", "--name", "sh",
                    "--command", "bash -c 'echo hello world'")
    assert result.code == 0, result.err
    assert Job.objects.get(pk=int(result.out)).workload == {"command": ["bash", "-c", "echo hello world"]}


def test_submit_from_a_yaml_file_with_flags_on_top(console, gpuctl, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: digits-yaml\nteam: vision\nkind: train\ngpus: 1\npreset: amp-bf16\ntime_limit_minutes: 20\n"
        "workload:\n  builtin: mlp-digits\n  params: {epochs: 1, hidden: 64}\n"
    )
    result = gpuctl("submit", "-f", spec, "--gpus", "2", "--param", "epochs=3", "--json")
    assert result.code == 0, result.err
    answer = json.loads(result.out)
    job = Job.objects.get(pk=answer["id"])
    assert answer["state"] == "queued" and answer["name"] == "digits-yaml"
    assert (job.gpus, job.preset, job.time_limit_minutes) == (2, "amp-bf16", 20)
    assert job.workload == {"builtin": "mlp-digits", "params": {"epochs": 3, "hidden": 64}}


def test_submit_from_a_json_file(console, gpuctl, tmp_path):
    spec = tmp_path / "infer.json"
    spec.write_text(json.dumps({"name": "serve", "team": "vision", "kind": "inference", "gpus": 1,
                                "preset": "infer-bf16", "workload": {"builtin": "tiny-lm"}}))
    result = gpuctl("submit", "-f", spec, "-q")
    assert result.code == 0, result.err
    job = Job.objects.get(pk=int(result.out))
    assert (job.kind, job.preset, job.workload) == ("inference", "infer-bf16", {"builtin": "tiny-lm", "params": {}})


def test_a_refused_spec_prints_the_field_errors_and_exits_2(console, gpuctl):
    result = gpuctl("submit", "--team", "vision", "--gpus", "99", "--preset", "nope", "--builtin", "mlp-digits",
                    "--param", "epochs=0")
    assert result.code == 2
    assert "the console refused the request" in result.err
    assert "gpus: Team vision may hold at most 8 GPUs at once." in result.err
    assert "preset: Unknown preset 'nope'" in result.err
    assert "workload.params.epochs: must be at least 1" in result.err
    assert result.out == "" and not Job.objects.exists()


def test_a_bad_spec_file_is_refused_before_sending(console, gpuctl, tmp_path):
    spec = tmp_path / "typo.yaml"
    spec.write_text("name: x\ngpu: 1\nworkload: {builtin: mlp-digits}\n")
    result = gpuctl("submit", "-f", spec)
    assert result.code == 2 and "unknown field(s) gpu" in result.err
    result = gpuctl("submit", "--team", "vision", "--gpus", "1")
    assert result.code == 2 and "what should the job run" in result.err
    assert not Job.objects.exists()


def test_a_viewer_may_not_submit(live_server, world, gpuctl):
    assert gpuctl("login", "--url", live_server.url, "-u", "vic", "--password-stdin", stdin=PASSWORD).code == 0
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits")
    assert result.code == 1 and "permission denied: Viewers of team vision cannot submit jobs." in result.err


# --- status, cancel, catalogue


def test_status_of_one_job_and_the_job_table(console, gpuctl, world):
    first = int(gpuctl("submit", "--team", "vision", "--gpus", "2", "--builtin", "mlp-digits", "-q").out)
    second = int(gpuctl("submit", "--team", "vision", "--gpus", "1", "--name", "waits", "--builtin",
                        "cnn-digits", "-q").out)
    node_a = [gpu.pk for gpu in world.gpus if gpu.host.name == "node-a"]
    assert services.job_place(first, tuple(node_a[:2]))
    assert services.job_mark_running(first)
    job = Job.objects.get(pk=first)
    job.steps_done, job.steps_per_second = 120, 41.5
    job.save(update_fields=["steps_done", "steps_per_second"])

    running = gpuctl("status", first)
    assert running.code == 0, running.err
    assert "state:        running" in running.out
    assert "node-a:0,1 (H200)" in running.out and "41.5 steps/s" in running.out

    waiting = gpuctl("status", second)
    assert "state:        queued" in waiting.out and "pending:      waiting for the scheduler" in waiting.out

    detail = json.loads(gpuctl("status", first, "--json").out)
    assert detail["id"] == first and detail["allocations"][0]["host"] == "node-a"

    listing = gpuctl("status")
    assert listing.code == 0
    lines = listing.out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "TEAM", "USER", "KIND", "GPUS", "STATE", "INFO"]
    assert [int(line.split()[0]) for line in lines[1:]] == [second, first]

    queued = json.loads(gpuctl("status", "--state", "queued", "--json").out)
    assert [job["id"] for job in queued] == [second]
    both = json.loads(gpuctl("status", "--state", "queued", "--state", "running", "--json").out)
    assert {job["id"] for job in both} == {first, second}
    assert json.loads(gpuctl("status", "--team", "nlp", "--json").out) == []
    assert len(json.loads(gpuctl("status", "--limit", "1", "--json").out)) == 1

    missing = gpuctl("status", 999999)
    assert missing.code == 1 and "job 999999 not found" in missing.err


def test_cancel(console, gpuctl):
    job_id = int(gpuctl("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits", "-q").out)
    result = gpuctl("cancel", job_id, "--reason", "not needed")
    assert result.code == 0, result.err
    assert f"Cancelled job {job_id}" in result.out
    assert Job.objects.get(pk=job_id).state == "cancelled"
    assert JobEvent.objects.filter(job_id=job_id, to_state="cancelled").get().reason == "cancelled by mia: not needed"

    again = gpuctl("cancel", job_id)
    assert again.code == 1 and "cannot be cancelled" in again.err and "already cancelled" in again.err
    assert gpuctl("cancel", 999999).code == 1


def test_presets_and_workloads(console, gpuctl):
    table = gpuctl("presets")
    assert table.code == 0
    assert table.out.splitlines()[0].split() == ["NAME", "KIND", "NEEDS", "DESCRIPTION"]
    assert "amp-bf16" in table.out and "multi-process" in table.out
    assert [p["name"] for p in json.loads(gpuctl("presets", "--json").out)] == list(PRESETS)

    workloads = gpuctl("workloads")
    assert workloads.code == 0 and "mlp-digits  (train, inference)" in workloads.out and "epochs (int" in workloads.out
    assert [w["name"] for w in json.loads(gpuctl("workloads", "--json").out)] == list(WORKLOADS)


# --- submit --wait: the job is driven by the test through the console's services


def place(job_id: int) -> None:
    job = Job.objects.get(pk=job_id)
    from apps.cluster.models import GPU

    free = GPU.objects.filter(allocations__isnull=True).order_by("host__name", "index")[: job.gpus]
    assert services.job_place(job_id, tuple(gpu.pk for gpu in free))


def running(job_id: int) -> None:
    assert services.job_mark_running(job_id)


def finish(succeeded: bool, exit_code: int | None, reason: str):
    def step(job_id: int) -> None:
        assert services.job_finish(job_id, succeeded=succeeded, exit_code=exit_code, reason=reason)

    return step


def cancel_as(username: str):
    def step(job_id: int) -> None:
        from django.contrib.auth import get_user_model

        actor = get_user_model().objects.get(username=username)
        services.job_cancel(job=Job.objects.get(pk=job_id), actor=actor, reason="make room")

    return step


def append_log(text: str):
    def step(job_id: int) -> None:
        job = Job.objects.get(pk=job_id)
        host = job.allocations.select_related("gpu__host").first().gpu.host
        services.job_append_log(host=host, job_id=job_id, attempt=job.attempts, data=text)

    return step


SUBMIT = ("submit", "--team", "vision", "--gpus", "1", "--builtin", "mlp-digits", "--wait", "--interval", "0.05")


@pytest.mark.parametrize(
    ("ending", "state", "expected"),
    [
        (finish(True, 0, "exited with code 0"), "succeeded", 0),
        (finish(False, 3, "exited with code 3"), "failed", 3),
        (finish(False, None, "host lost"), "failed", 1),
        (cancel_as("manny"), "cancelled", 130),
    ],
    ids=["succeeded", "failed-with-code", "failed-without-code", "cancelled"],
)
def test_submit_wait_follows_the_job_and_exits_with_its_code(console, gpuctl, drive, ending, state, expected):
    driver = drive(place, running, ending)
    result = gpuctl(*SUBMIT)
    driver.join()
    assert result.code == expected, result.err
    job_id = driver.job_id
    assert result.out.startswith(f"Submitted job {job_id} ")
    transitions = [line for line in result.err.splitlines() if line.startswith(f"[gpuctl] job {job_id}: ")]
    assert transitions[0].startswith(f"[gpuctl] job {job_id}: queued")
    assert transitions[1].startswith(f"[gpuctl] job {job_id}: queued -> placed: node-a:0 (H200)")
    assert transitions[2].startswith(f"[gpuctl] job {job_id}: placed -> running")
    assert transitions[3].startswith(f"[gpuctl] job {job_id}: running -> {state}")
    assert f"exiting with status {expected}" in result.err
    assert Job.objects.get(pk=job_id).state == state


def test_submit_wait_json_prints_the_final_job(console, gpuctl, drive):
    driver = drive(place, finish(False, 7, "exited with code 7"))
    result = gpuctl(*SUBMIT, "--json", "--no-logs")
    driver.join()
    assert result.code == 7
    final = json.loads(result.out)
    assert final["id"] == driver.job_id and final["state"] == "failed" and final["exit_code"] == 7


def test_ctrl_c_stops_waiting_but_does_not_cancel(console, gpuctl, monkeypatch):
    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(follow, "sleep", interrupted)
    result = gpuctl(*SUBMIT)
    assert result.code == 130
    job = Job.objects.get()
    assert job.state == "queued"
    assert "NOT cancelled" in result.err and f"gpuctl cancel {job.pk}" in result.err


def test_submit_wait_streams_the_log(console, gpuctl, drive, config_file):
    lines = ["epoch 1 loss 0.50\n", "epoch 2 loss 0.25\n", "done\n"]
    driver = drive(place, running, *(append_log(line) for line in lines), finish(True, 0, "exited with code 0"))
    result = gpuctl(*SUBMIT)
    driver.join()
    assert result.code == 0, result.err
    job_id = driver.job_id

    answer = httpx.get(f"{console}/api/v1/jobs/{job_id}/logs/", params={"after": 0},
                       headers={"Authorization": f"Bearer {saved_token(config_file)}"})
    if answer.status_code == 404:
        assert "does not serve job logs" in result.err
        logs = gpuctl("logs", job_id)
        assert logs.code == 1 and "does not serve job logs yet" in logs.err
        pytest.skip("GET /api/v1/jobs/{id}/logs/ answers 404 (the endpoint is not built yet): log streaming "
                    "is unchecked; the wait loop's states and exit codes are tested above")
    page = answer.json()
    assert (page["data"], page["next"], page["complete"]) == ("".join(lines), len("".join(lines)), True)
    assert result.out.split("\n", 1)[1] == "".join(lines)  # after the "Submitted job" line, each line once

    logs = gpuctl("logs", job_id)
    assert logs.code == 0 and logs.out == "".join(lines)
    followed = gpuctl("logs", job_id, "--follow", "--interval", "0.05")
    assert followed.code == 0 and followed.out == "".join(lines)


# --- the installed console script, as a real process


def test_the_console_script_works_as_a_process(live_server, world, config_file):
    script = Path(sys.executable).with_name("gpuctl")
    assert script.exists(), "pip install -e . should have installed the gpuctl console script"
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUCTL_")}
    env["GPUCTL_CONFIG"] = str(config_file)

    def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)

    login = run(str(script), "login", "--url", live_server.url, "-u", "mia", "--password-stdin", stdin=PASSWORD)
    assert login.returncode == 0, login.stderr
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600

    submit = run(sys.executable, "-m", "workers.cli", "submit", "--team", "vision", "--gpus", "1",
                 "--builtin", "mlp-digits", "-q")
    assert submit.returncode == 0, submit.stderr
    assert Job.objects.get(pk=int(submit.stdout)).user.username == "mia"

    refused = run(str(script), "submit", "--team", "vision", "--gpus", "1", "--builtin", "nope")
    assert refused.returncode == 2 and "workload.builtin: Unknown built-in workload 'nope'" in refused.stderr
