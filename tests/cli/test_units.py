"""gpuctl's pieces without a console: specs, settings, errors, exit codes, and the wait loop against a fake API."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import httpx
import pytest

from workers.cli import follow
from workers.cli.client import Api
from workers.cli.config import load_config, normalize_url, save_config_file
from workers.cli.errors import CliError, UsageError, format_field_errors
from workers.cli.follow import LogStream, follow_log, job_exit_code, wait_for_job
from workers.cli.main import main
from workers.cli.spec import build_spec, load_spec_file, parse_param

URL = "http://console.test"


# --- exit codes, errors


@pytest.mark.parametrize(
    ("job", "code"),
    [
        ({"state": "succeeded", "exit_code": 0}, 0),
        ({"state": "succeeded", "exit_code": None}, 0),
        ({"state": "failed", "exit_code": 3}, 3),
        ({"state": "failed", "exit_code": None}, 1),
        ({"state": "failed", "exit_code": 0}, 1),  # failed is never success
        ({"state": "failed", "exit_code": -9}, 137),  # killed by SIGKILL, as a shell reports it
        ({"state": "failed", "exit_code": 300}, 1),
        ({"state": "cancelled", "exit_code": None}, 130),
    ],
)
def test_job_exit_code(job, code):
    assert job_exit_code(job) == code


def test_field_errors_are_flattened_with_dotted_names():
    payload = {
        "gpus": ["Team vision may hold at most 8 GPUs at once."],
        "workload": {"params": {"epochs": ["must be at least 1"]}},
        "non_field_errors": ["Unknown username or wrong password."],
    }
    assert format_field_errors(payload) == [
        "gpus: Team vision may hold at most 8 GPUs at once.",
        "workload.params.epochs: must be at least 1",
        "Unknown username or wrong password.",
    ]


# --- specs


def test_params_are_json_when_they_parse():
    assert parse_param("lr=1e-3") == ("lr", 0.001)
    assert parse_param("epochs=2") == ("epochs", 2)
    assert parse_param("flag=true") == ("flag", True)
    assert parse_param("checkpoint=/data/model.pt") == ("checkpoint", "/data/model.pt")
    assert parse_param('seed="7"') == ("seed", "7")
    assert parse_param("expr=a=b") == ("expr", "a=b")
    with pytest.raises(UsageError):
        parse_param("no-equals-sign")


def test_flags_override_the_file_and_params_merge():
    base = {"name": "a", "gpus": 1, "workload": {"builtin": "mlp-digits", "params": {"epochs": 1, "hidden": 64}}}
    spec = build_spec(base, {"gpus": 4, "team": None}, params=["epochs=5"])
    assert spec == {"name": "a", "gpus": 4,
                    "workload": {"builtin": "mlp-digits", "params": {"epochs": 5, "hidden": 64}}}
    # another builtin drops the file's params (they belong to the other workload)
    assert build_spec(base, {}, builtin="tiny-lm")["workload"] == {"builtin": "tiny-lm", "params": {}}
    # a command replaces a builtin workload
    assert build_spec(base, {}, argv=["python", "x.py"])["workload"] == {"command": ["python", "x.py"]}


def test_spec_conflicts_are_usage_errors():
    with pytest.raises(UsageError, match="not both"):
        build_spec({}, {}, builtin="mlp-digits", argv=["python"])
    with pytest.raises(UsageError, match="--command or after --"):
        build_spec({}, {}, command="python x.py", argv=["python"])
    with pytest.raises(UsageError, match="needs a built-in workload"):
        build_spec({}, {}, params=["epochs=1"])
    with pytest.raises(UsageError, match="command takes its own arguments"):
        build_spec({}, {}, params=["epochs=1"], argv=["python"])
    with pytest.raises(UsageError, match="--command"):
        build_spec({}, {}, command="python 'unterminated")


def test_names_default_to_what_runs():
    assert build_spec({}, {}, builtin="tiny-lm")["name"] == "tiny-lm"
    assert build_spec({}, {}, command="/opt/venv/bin/python train.py")["name"] == "python"
    assert build_spec({"name": "kept"}, {}, builtin="tiny-lm")["name"] == "kept"


def test_spec_files(tmp_path, monkeypatch):
    good = tmp_path / "job.yml"
    good.write_text("name: x\ngpus: 2\nworkload: {builtin: mlp-digits}\n")
    assert load_spec_file(str(good)) == {"name": "x", "gpus": 2, "workload": {"builtin": "mlp-digits"}}
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"name": "from-stdin", "gpus": 1}'))
    assert load_spec_file("-") == {"name": "from-stdin", "gpus": 1}

    for text, message in [("- a\n- b\n", "must hold a mapping"), ("", "is empty"), ("name: [\n", "not valid YAML"),
                          ("nmae: x\n", "unknown field")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(UsageError, match=message):
            load_spec_file(str(bad))
    with pytest.raises(UsageError, match="cannot read"):
        load_spec_file(str(tmp_path / "missing.yaml"))


def test_dry_run_keeps_options_after_double_dash(capsys):
    code = main(["submit", "--dry-run", "--gpus", "1", "--", "python", "-c", "print(1)", "--flag", "--"])
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {
        "gpus": 1, "workload": {"command": ["python", "-c", "print(1)", "--flag", "--"]}, "name": "python"}


def test_cpus_and_memory_flags_go_into_the_spec(capsys):
    assert main(["submit", "--dry-run", "--gpus", "1", "--cpus", "1.5", "--memory-gb", "0.25", "--", "true"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert (spec["cpus"], spec["memory_gb"]) == (1.5, 0.25)
    assert main(["submit", "--dry-run", "--gpus", "1", "--cpus", "0", "--", "true"]) == 2
    assert main(["submit", "--dry-run", "--gpus", "1", "--memory-gb", "lots", "--", "true"]) == 2


def test_usage_errors_exit_2(capsys):
    assert main(["submit", "--gpus", "two"]) == 2
    assert main(["status", "abc"]) == 2
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert main(["submit", "--gpus", "1"]) == 2  # nothing to run
    assert "what should the job run" in capsys.readouterr().err


# --- settings


def test_urls_are_normalized():
    assert normalize_url(" https://gpu.example.org/ ") == "https://gpu.example.org"
    assert normalize_url("http://127.0.0.1:8000/console/") == "http://127.0.0.1:8000/console"
    for bad in ("gpu.example.org", "ftp://gpu.example.org", "https://", "https://x.org/?a=1"):
        with pytest.raises(UsageError):
            normalize_url(bad)


def test_config_file_is_private_even_in_an_existing_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCTL_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.delenv("GPUCTL_URL", raising=False)
    monkeypatch.delenv("GPUCTL_TOKEN", raising=False)
    old_umask = os.umask(0)
    try:
        save_config_file(tmp_path / "config.json", {"url": URL, "token": "secret", "token_id": 4})
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "config.json").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left behind
    config = load_config()
    assert (config.url, config.token, config.token_id, config.token_from_env) == (URL, "secret", 4, False)

    monkeypatch.setenv("GPUCTL_URL", "https://ci.example.org/")
    monkeypatch.setenv("GPUCTL_TOKEN", "from-ci")
    config = load_config()
    assert (config.url, config.token, config.token_id, config.token_from_env) == (
        "https://ci.example.org", "from-ci", None, True)


def test_a_damaged_config_file_is_reported(tmp_path, monkeypatch):
    path: Path = tmp_path / "config.json"
    path.write_text("{not json")
    monkeypatch.setenv("GPUCTL_CONFIG", str(path))
    with pytest.raises(CliError, match="gpuctl login"):
        load_config()


# --- the wait loop against a scripted API


class FakeConsole:
    """Answers GET jobs/5/ with the next of `states` and serves `log` through jobs/5/logs/ in small pages."""

    def __init__(self, states: list[dict], log: str = "", page: int = 4, logs_status: int = 200,
                 failures: int = 0) -> None:
        self.states = states
        self.log = log
        self.page = page
        self.logs_status = logs_status
        self.failures = failures
        self.index = -1
        self.calls: list[str] = []

    @property
    def final(self) -> bool:
        return self.states[self.index]["state"] in follow.FINAL_STATES

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.url.path}?{request.url.query.decode()}")
        if self.failures:
            self.failures -= 1
            return httpx.Response(503, json={"detail": "The console's database is unavailable; try again shortly."})
        if request.url.path == "/api/v1/jobs/5/":
            self.index = min(self.index + 1, len(self.states) - 1)
            return httpx.Response(200, json={"id": 5, **self.states[self.index]})
        if request.url.path == "/api/v1/jobs/5/logs/":
            if self.logs_status != 200:
                return httpx.Response(self.logs_status, json={"detail": "nope"})
            after = int(request.url.params["after"])
            visible = self.log if self.final else self.log[: len(self.log) // 2]
            data = visible[after:after + self.page]
            complete = self.final and after + len(data) >= len(self.log)
            return httpx.Response(200, json={"data": data, "next": after + len(data), "complete": complete})
        return httpx.Response(404, json={"detail": "Not found."})


@pytest.fixture
def no_sleep(monkeypatch):
    monkeypatch.setattr(follow, "sleep", lambda seconds: None)


def wait(console: FakeConsole, *, logs: bool = True) -> tuple[dict, str]:
    out = io.StringIO()
    with Api(URL, "token", transport=httpx.MockTransport(console)) as api:
        stream = LogStream(api, 5, out) if logs else None
        job = wait_for_job(api, 5, interval=0.01, logs=stream)
    return job, out.getvalue()


STATES = [{"state": "queued", "pending_reason": "team vision holds 8 of 8 GPUs", "queue_position": 2},
          {"state": "queued", "pending_reason": "waiting for 1 free GPUs", "queue_position": 1},
          {"state": "running", "allocations": [{"host": "node-a", "index": 3, "gpu_type": "H200"}]},
          {"state": "running", "allocations": [{"host": "node-a", "index": 3, "gpu_type": "H200"}]},
          {"state": "failed", "exit_code": 2, "failure_reason": "exited with code 2"}]


def test_wait_streams_every_character_once_and_reports_states(no_sleep, capsys):
    log = "".join(f"line {i}\n" for i in range(20))
    job, out = wait(FakeConsole(STATES, log))
    assert job["state"] == "failed" and job_exit_code(job) == 2
    assert out == log
    assert capsys.readouterr().err.splitlines() == [
        "[gpuctl] job 5: queued: team vision holds 8 of 8 GPUs (position 2)",
        "[gpuctl] job 5: queued: waiting for 1 free GPUs (position 1)",
        "[gpuctl] job 5: queued -> running: node-a:3 (H200)",
        "[gpuctl] job 5: running -> failed: exit code 2",
    ]


def test_wait_without_a_logs_endpoint_follows_the_state(no_sleep, capsys):
    console = FakeConsole(STATES, "ignored", logs_status=404)
    job, out = wait(console)
    assert job_exit_code(job) == 2 and out == ""
    assert "does not serve job logs" in capsys.readouterr().err
    assert sum("/logs/" in call for call in console.calls) == 1  # asked once, then left alone


def test_a_broken_logs_endpoint_does_not_end_the_wait(no_sleep, capsys):
    job, _ = wait(FakeConsole(STATES, "x", logs_status=403))
    assert job_exit_code(job) == 2
    assert "cannot read the job's log" in capsys.readouterr().err


def test_wait_rides_out_a_console_restart(no_sleep, capsys):
    job, out = wait(FakeConsole(STATES, "hello\n", failures=3))
    assert job_exit_code(job) == 2 and out == "hello\n"
    err = capsys.readouterr().err
    assert "HTTP 503" in err and "retrying" in err and "answers again" in err


def test_wait_gives_up_when_the_console_stays_away(no_sleep, monkeypatch):
    ticks = iter(range(0, 10_000, 100))
    monkeypatch.setattr(follow, "clock", lambda: next(ticks))
    with pytest.raises(CliError, match="HTTP 503"):
        wait(FakeConsole(STATES, failures=1000))


def test_logs_says_when_the_console_has_no_logs_endpoint(no_sleep):
    with Api(URL, "t", transport=httpx.MockTransport(FakeConsole(STATES, logs_status=404))) as api:
        with pytest.raises(CliError, match="does not serve job logs yet"):
            follow_log(api, 5, interval=0.01, follow=False)
        with pytest.raises(CliError, match="job 6 not found"):
            follow_log(api, 6, interval=0.01, follow=True)


def test_logs_follow_reads_until_complete(no_sleep):
    log = "".join(f"step {i}\n" for i in range(10))
    out = io.StringIO()
    console = FakeConsole(STATES, log)
    console.index = len(STATES) - 1  # the job has ended: the whole log is there
    with Api(URL, "t", transport=httpx.MockTransport(console)) as api:
        follow_log(api, 5, interval=0.01, follow=True, stream=out)
    assert out.getvalue() == log


def test_errors_say_what_to_do():
    def answer(status: int, body: object):
        return httpx.MockTransport(lambda request: httpx.Response(status, json=body))

    with Api(URL, "t", transport=answer(401, {"detail": "Invalid, expired or revoked token."})) as api, \
            pytest.raises(CliError) as caught:
        api.get("jobs/")
    assert "not logged in to http://console.test" in caught.value.message and "gpuctl login" in caught.value.message
    assert caught.value.exit_code == 1

    with Api(URL, "t", transport=answer(400, {"gpus": ["too many"]})) as api, pytest.raises(CliError) as caught:
        api.post("jobs/", {})
    assert caught.value.exit_code == 2 and caught.value.message.endswith("\n  gpus: too many")

    html = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>"))
    with Api(URL, "t", transport=html) as api, pytest.raises(CliError, match="did not answer JSON"):
        api.get("jobs/")
