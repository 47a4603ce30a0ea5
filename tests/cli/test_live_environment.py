"""gpuctl's container options and `gpuctl secret` against a real console (pytest-django's live server).

Each test runs once the console has the endpoint it needs (issue 16's code snapshots, job fields and team
secrets are built beside gpuctl); until then it is skipped and tests/cli/test_environment.py checks the requests
against a recording server."""

from __future__ import annotations

import hashlib
import json
import re

import httpx
import pytest
from django.urls import Resolver404, resolve

from tests.cli.conftest import PASSWORD


def routed(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def accepts_container_fields() -> bool:
    from apps.jobs.serializers import JobSubmitSerializer

    return {"image", "env", "code"} <= set(JobSubmitSerializer().fields)


needs_snapshots = pytest.mark.skipif(
    not (routed("/api/v1/code-snapshots/") and accepts_container_fields()),
    reason="the console has no code-snapshots endpoint or container job fields yet")
needs_secrets = pytest.mark.skipif(not routed("/api/v1/teams/vision/secrets/"),
                                   reason="the console has no team secrets endpoint yet")


@needs_snapshots
def test_submit_code_uploads_a_snapshot_the_job_starts_in(console, gpuctl, config_file, tmp_path):
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    (project / "train.py").write_text("print('training')\n")
    (project / ".consoleignore").write_text("out/\n")
    (project / "out" / "big.bin").write_bytes(b"\0" * 4096)
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--image", "localhost/train:1", "--env", "EPOCHS=2",
                    "--code", project, "--json", "--", "python", "train.py")
    assert result.code == 0, result.err
    digest = re.search(r"sha256 ([0-9a-f]{64})", result.err)[1]
    snapshot = re.search(r"Uploaded code snapshot (\S+) to team vision", result.err)[1]
    job = json.loads(result.out)
    assert job["image"] == "localhost/train:1" and job["env"] == {"EPOCHS": "2"}
    assert job["code"]["snapshot"] == snapshot

    token = json.loads(config_file.read_text())["token"]
    with httpx.Client(base_url=console, headers={"Authorization": f"Bearer {token}"}) as http:
        stored = http.get(f"/api/v1/code-snapshots/{snapshot}/").json()
        archive = http.get(f"/api/v1/code-snapshots/{snapshot}/download/")
    assert stored["sha256"] == digest and stored["files"] == 2  # train.py and .consoleignore, not out/
    assert hashlib.sha256(archive.content).hexdigest() == digest


@needs_snapshots
def test_a_refused_container_field_prints_the_field_and_exits_2(console, gpuctl):
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--image", "localhost/train:1",
                    "--mount", "no-such-volume", "--", "python", "train.py")
    assert result.code == 2
    assert "mounts" in result.err


@needs_secrets
def test_a_manager_creates_lists_rotates_and_deletes_a_secret(live_server, world, gpuctl, tmp_path):
    login = gpuctl("login", "--url", live_server.url, "-u", "manny", "--password-stdin", stdin=PASSWORD)
    assert login.code == 0, login.err
    created = gpuctl("secret", "create", "WANDB_API_KEY", "--team", "vision", stdin="first-value\n")
    assert created.code == 0, created.err
    listed = gpuctl("secret", "list", "--team", "vision")
    assert listed.code == 0 and listed.out.splitlines()[1].split()[:2] == ["WANDB_API_KEY", "1"]
    value = tmp_path / "value"
    value.write_text("second-value")
    assert gpuctl("secret", "rotate", "WANDB_API_KEY", "--team", "vision", "--from-file", value).code == 0
    assert json.loads(gpuctl("secret", "list", "--team", "vision", "--json").out)[0]["version"] == 2
    everything = created.out + created.err + listed.out
    assert "first-value" not in everything and "second-value" not in everything
    assert gpuctl("secret", "delete", "WANDB_API_KEY", "--team", "vision").code == 0
    assert "has no secrets" in gpuctl("secret", "list", "--team", "vision").err


@needs_secrets
def test_a_member_may_not_create_a_secret(console, gpuctl):
    result = gpuctl("secret", "create", "X", "--team", "vision", stdin="v")
    assert result.code == 1
    assert "permission denied" in result.err


def test_service_create_from_an_image_with_env_secret_and_argv(console, gpuctl, world):
    from apps.accounts.secrets import secret_create
    from apps.serving.models import InferenceService

    secret_create(team=world.vision, name="HF_TOKEN", value="hf-value-0123456789", actor=world.manager)
    result = gpuctl("service", "create", "own", "--team", "vision", "--image", "localhost/server:1", "--env",
                    "MODEL=small", "--secret", "HF_TOKEN", "--max", "2", "--target-rps", "5", "--json", "--",
                    "python3", "/srv/server.py", "--port", "8080")
    assert result.code == 0, result.err
    service = json.loads(result.out)
    assert service["image"] == "localhost/server:1" and service["workload"] == ""
    assert service["command"] == ["python3", "/srv/server.py", "--port", "8080"]
    assert service["env"] == {"MODEL": "small"} and service["secrets"] == ["HF_TOKEN"]
    shown = gpuctl("service", "show", "vision/own")
    assert "localhost/server:1: python3 /srv/server.py --port 8080" in shown.out
    missing = gpuctl("service", "create", "other", "--team", "vision", "--image", "localhost/server:1")
    assert missing.code != 0 and "command" in missing.err
    both = gpuctl("service", "create", "other", "--team", "vision", "--workload", "mlp-digits", "--image", "x:1",
                  "--", "serve")
    assert both.code != 0 and "not both" in both.err
    assert InferenceService.objects.count() == 1
