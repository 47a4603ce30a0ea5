"""A job's environment on submission (issue 16): image, env, secrets, mounts, code and shm_gb, through the API and
the submit page alike (job_submit checks them all): valid specs are stored, each bad field is a 400 naming it."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from django.test import Client

from apps.accounts.secrets import secret_create
from apps.cluster.volumes import volume_create
from apps.jobs.models import Job, JobEvent
from apps.jobs.scheduling_rows import pending_job
from tests.conftest import train_spec
from tests.dashboard.test_jobs import form_data

IMAGE = "registry.example.org:5000/team/train:1.2@sha256:" + "a" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def team_things(world, settings, tmp_path):
    """Team vision's secret WANDB_API_KEY and volume imagenet; nlp's volume private-data."""
    secret_create(team=world.vision, name="WANDB_API_KEY", value="s3cr3t-value", actor=world.manager)
    root = tmp_path / "volumes"
    for name in ("imagenet", "private"):
        (root / name).mkdir(parents=True)
    volume_create(actor=world.admin, name="imagenet", host_path=str(root / "imagenet"), teams=[world.vision])
    volume_create(actor=world.admin, name="private-data", host_path=str(root / "private"), teams=[world.nlp])
    return world


def container_spec(**overrides) -> dict:
    spec = train_spec(workload={"command": ["python", "train.py"]}, image=IMAGE, env={"LR": "0.1", "_X1": ""},
                      secrets=["WANDB_API_KEY"], mounts=["imagenet"],
                      code={"git": {"url": "https://example.org/team/repo.git", "ref": COMMIT}},
                      shm_gb=2, memory_gb=8)
    spec.update(overrides)
    return spec


def test_a_full_spec_is_stored_and_shown(team_things, client_for):
    world = team_things
    response = client_for(world.member).post("/api/v1/jobs/", container_spec(), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    job = Job.objects.get()
    assert (job.image, job.env, job.secrets, job.mounts, job.shm_gb) == (
        IMAGE, {"LR": "0.1", "_X1": ""}, ["WANDB_API_KEY"], ["imagenet"], 2.0)
    assert (job.git_url, job.git_ref, job.git_commit) == ("https://example.org/team/repo.git", COMMIT, COMMIT)
    code = {"git": {"url": "https://example.org/team/repo.git", "ref": COMMIT, "commit": COMMIT}}
    assert body["code"] == code and body["image"] == IMAGE and body["secrets"] == ["WANDB_API_KEY"]
    assert body["backend"] is None and body["resolved_image"] == ""
    read = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert {k: read[k] for k in ("image", "env", "secrets", "mounts", "code", "shm_gb")} == {
        "image": IMAGE, "env": {"LR": "0.1", "_X1": ""}, "secrets": ["WANDB_API_KEY"], "mounts": ["imagenet"],
        "code": code, "shm_gb": 2.0}
    assert read == {**body, "pending_reason": read["pending_reason"], "queue_position": read["queue_position"],
                    "estimated_start": read["estimated_start"]}
    # Nothing of the secret's value is kept on the job or its events.
    assert "s3cr3t" not in str(Job.objects.filter(pk=job.pk).values().get())
    assert "s3cr3t" not in str(list(JobEvent.objects.values()))


def test_volumes_without_an_image_are_taken_for_hosts_that_run_jobs_under_their_own_uid(team_things, client_for):
    """A job without an image runs as processes on the host; its volumes are bound in its filesystem view by an agent
    that runs it under a uid of its own (placement: tests/scheduling/test_host_needs.py)."""
    spec = container_spec(image="", shm_gb=None, secrets=[])
    response = client_for(team_things.member).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert job.mounts == spec["mounts"] and pending_job(job, 0.0).needs_own_uid
    bad = client_for(team_things.member).post("/api/v1/jobs/", {**spec, "mounts": ["not-there"]}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"mounts"}
    plain = client_for(team_things.member).post("/api/v1/jobs/", {**spec, "mounts": []}, format="json")
    assert not pending_job(Job.objects.get(pk=plain.json()["id"]), 0.0).needs_own_uid


def test_secrets_without_an_image_are_taken_for_hosts_that_run_jobs_under_their_own_uid(team_things, client_for):
    spec = container_spec(image="", shm_gb=None, mounts=[])
    response = client_for(team_things.member).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().secrets == ["WANDB_API_KEY"]
    bad = client_for(team_things.member).post("/api/v1/jobs/", {**spec, "secrets": ["NOT_THERE"]}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"secrets"}


def test_env_and_code_go_without_an_image(team_things, client_for):
    spec = container_spec(image="", shm_gb=None, secrets=[], mounts=[])
    response = client_for(team_things.member).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get().env == {"LR": "0.1", "_X1": ""}


def test_a_job_without_an_environment_is_as_before(world, client_for):
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(), format="json")
    assert response.status_code == 201
    body = response.json()
    assert (body["image"], body["env"], body["secrets"], body["mounts"], body["code"], body["shm_gb"]) == (
        "", {}, [], [], None, None)


@pytest.mark.parametrize("image", [
    "python", "python:3.11-slim", "localhost/base:1", "localhost:5000/a/b/c:latest", "ghcr.io/org/img",
    "docker.io/library/ubuntu@sha256:" + "0" * 64, "my-registry.local:443/x__y/z.w-q:V1.0_rc"])
def test_good_image_references(world, client_for, image):
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(image=image), format="json")
    assert response.status_code == 201, response.content


BAD = [
    ("image", {"image": "Python:3"}),  # upper-case name
    ("image", {"image": "python:"}),
    ("image", {"image": "a" * 256}),
    ("image", {"image": "python@sha256:abc"}),
    ("image", {"image": "http://registry/x"}),
    ("image", {"image": "x y"}),
    ("image", {"image": ["python"]}),
    ("image", {"image": "a\x00b"}),
    ("env", {"env": ["A=1"]}),
    ("env", {"env": {"1A": "x"}}),
    ("env", {"env": {"A-B": "x"}}),
    ("env", {"env": {"CONSOLE_JOB_ID": "7"}}),
    ("env", {"env": {"CONSOLE_ANYTHING": "7"}}),
    ("env", {"env": {"CUDA_VISIBLE_DEVICES": "0"}}),
    ("env", {"env": {"A": 1}}),
    ("env", {"env": {"A": "x" * (32 * 1024 + 1)}}),
    ("env", {"env": {"A": "a\x00b"}}),
    ("env", {"env": {f"V{i}": "" for i in range(101)}}),
    ("env", {"env": {"WANDB_API_KEY": "plain"}}),  # also a secret the job names
    ("secrets", {"secrets": "WANDB_API_KEY"}),
    ("secrets", {"secrets": ["NO_SUCH_SECRET"]}),
    ("secrets", {"secrets": ["WANDB_API_KEY", "WANDB_API_KEY"]}),
    ("secrets", {"secrets": [1]}),
    ("mounts", {"mounts": ["no-such-volume"]}),
    ("mounts", {"mounts": ["private-data"]}),  # nlp's volume: not open to vision
    ("mounts", {"mounts": "imagenet"}),
    ("code", {"code": "."}),
    ("code", {"code": {"snapshot": "not-a-uuid"}}),
    ("code", {"code": {"snapshot": "00000000-0000-0000-0000-000000000000"}}),
    ("code", {"code": {"snapshot": "x", "git": {}}}),
    ("code", {"code": {"git": {"url": "file:///etc", "ref": COMMIT}}}),
    ("code", {"code": {"git": {"url": "/srv/repo", "ref": COMMIT}}}),
    ("code", {"code": {"git": {"url": "https://example.org/r.git", "ref": "--upload-pack=x"}}}),
    ("code", {"code": {"git": {"url": "https://example.org/r.git", "branch": "main"}}}),
    ("code", {"code": {"git": "https://example.org/r.git"}}),
    ("shm_gb", {"shm_gb": 0}),
    ("shm_gb", {"shm_gb": -1}),
    ("shm_gb", {"shm_gb": 10_000}),
    ("shm_gb", {"shm_gb": "big"}),
    ("shm_gb", {"shm_gb": 16, "memory_gb": 8}),  # more than the job's memory
    ("shm_gb", {"image": "", "shm_gb": 1}),  # no container to size
    ("imagez", {"imagez": "python"}),  # unknown fields are still refused
]


@pytest.mark.parametrize(("field", "overrides"), BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_bad_field_gets_400_naming_it(team_things, client_for, field, overrides):
    response = client_for(team_things.member).post("/api/v1/jobs/", container_spec(**overrides), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Job.objects.exists() and not JobEvent.objects.exists()


def test_another_teams_snapshot_reads_as_none(team_things, client_for, snapshot_of):
    nlp_snapshot = snapshot_of(team_things.other, "nlp")
    response = client_for(team_things.member).post(
        "/api/v1/jobs/", container_spec(code={"snapshot": nlp_snapshot}), format="json")
    assert response.status_code == 400
    assert response.json()["code"] == {"snapshot": [f"Team vision has no code snapshot {nlp_snapshot}."]}
    mine = snapshot_of(team_things.member, "vision")
    response = client_for(team_things.member).post("/api/v1/jobs/", container_spec(code={"snapshot": mine}),
                                                   format="json")
    assert response.status_code == 201, response.content
    assert response.json()["code"] == {"snapshot": mine, "download": f"/api/v1/code-snapshots/{mine}/download/"}


# --- git: the commit recorded at submission, read with `git ls-remote` from a real repository -------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@x", "HOME": str(cwd), "PATH": "/usr/bin:/bin"}).stdout.strip()


@pytest.fixture
def git_repo(tmp_path):
    """A repository served by a real `git daemon` on 127.0.0.1: (url, {ref: commit})."""
    base = tmp_path / "served"
    repo = base / "repo"
    repo.mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "main.py").write_text("print('hi')\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-q", "-m", "one", cwd=repo)
    first = _git("rev-parse", "HEAD", cwd=repo)
    _git("tag", "-a", "v1", "-m", "v1", cwd=repo)
    (repo / "main.py").write_text("print('two')\n")
    _git("commit", "-q", "-am", "two", cwd=repo)
    second = _git("rev-parse", "HEAD", cwd=repo)
    port = _free_port()
    daemon = subprocess.Popen(["git", "daemon", "--export-all", "--reuseaddr", f"--base-path={base}",
                               "--listen=127.0.0.1", f"--port={port}", str(base)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:  # until the daemon listens (it exits on failure: then the test fails, not hangs)
            assert daemon.poll() is None, "git daemon exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"git://127.0.0.1:{port}/repo", {"main": second, "v1": first}
    finally:
        daemon.terminate()
        daemon.wait()


@pytest.mark.parametrize("ref", ["main", "v1", "HEAD", ""])
def test_a_git_ref_is_recorded_as_its_commit(world, client_for, git_repo, ref):
    url, commits = git_repo
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(code={"git": {"url": url, "ref": ref}}),
                                             format="json")
    assert response.status_code == 201, response.content
    expected = commits["v1"] if ref == "v1" else commits["main"]  # an annotated tag: the commit it points at
    assert response.json()["code"] == {"git": {"url": url, "ref": ref or "HEAD", "commit": expected}}


def test_an_unknown_ref_or_an_unreachable_repository_is_a_400_naming_code(world, client_for, git_repo):
    url, _ = git_repo
    unknown = client_for(world.member).post(
        "/api/v1/jobs/", train_spec(code={"git": {"url": url, "ref": "no-such-branch"}}), format="json")
    assert unknown.status_code == 400
    assert "No branch or tag 'no-such-branch'" in str(unknown.json()["code"]["git"]["ref"])
    closed = f"git://127.0.0.1:{_free_port()}/repo"
    unreachable = client_for(world.member).post(
        "/api/v1/jobs/", train_spec(code={"git": {"url": closed, "ref": "main"}}), format="json")
    assert unreachable.status_code == 400 and "could not read the repository" in str(unreachable.json()["code"])
    # A commit is its own record: the repository need not be reachable.
    pinned = client_for(world.member).post(
        "/api/v1/jobs/", train_spec(code={"git": {"url": closed, "ref": COMMIT}}), format="json")
    assert pinned.status_code == 201 and pinned.json()["code"]["git"]["commit"] == COMMIT


# --- the submit page reaches the same checks ----------------------------------------------------------------


def page(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def environment_form(**overrides) -> dict:
    return form_data(**{"workload_mode": "command", "command": "python train.py", "params": "", "builtin": "",
                        "image": IMAGE, "env": "LR=0.1\nEMPTY=\n", "secrets": "WANDB_API_KEY", "mounts": "imagenet",
                        "code_snapshot": "", "git_url": "https://example.org/team/repo.git", "git_ref": COMMIT,
                        "shm_gb": "1", **overrides})


def test_the_page_submits_a_full_environment(team_things):
    response = page(team_things.member).post("/jobs/new/", environment_form())
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    job = Job.objects.get()
    assert (job.image, job.env, job.secrets, job.mounts, job.git_commit, job.shm_gb) == (
        IMAGE, {"LR": "0.1", "EMPTY": ""}, ["WANDB_API_KEY"], ["imagenet"], COMMIT, 1.0)
    shown = page(team_things.member).get(f"/jobs/{job.pk}/").content.decode()
    for fragment in (IMAGE, "LR=0.1", "WANDB_API_KEY", "imagenet", COMMIT, "1.0 GiB"):
        assert fragment in shown
    assert "s3cr3t" not in shown


@pytest.mark.parametrize(("overrides", "field", "fragment"), [
    ({"image": "Bad:Image"}, "image", "is no OCI image reference"),
    ({"env": "CONSOLE_JOB_ID=3"}, "env", "CONSOLE_JOB_ID: The agent sets this variable"),
    ({"env": "no equals sign"}, "env", "write NAME=value"),
    ({"secrets": "NOPE"}, "secrets", "NOPE"),
    ({"mounts": "private-data"}, "mounts", "private-data"),
    ({"git_url": "file:///etc"}, "git_url", "https://, ssh:// or git://"),
    ({"git_ref": "-x"}, "git_ref", "not starting with '-'"),
    ({"code_snapshot": "nope", "git_url": "", "git_ref": ""}, "code_snapshot", "code snapshot's id"),
    ({"shm_gb": "100"}, "shm_gb", "at most the job's memory"),
])
def test_the_page_shows_the_services_refusal_on_the_field(team_things, overrides, field, fragment):
    response = page(team_things.member).post("/jobs/new/", environment_form(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(fragment in message for message in errors.get(field, [])), errors
    assert not Job.objects.exists()
