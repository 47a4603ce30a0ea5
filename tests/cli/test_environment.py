"""gpuctl's container options (image, env, secrets, mounts, shm, code, git), `-f job.yaml` with them, and
`gpuctl secret`. The code-snapshot and team-secret endpoints are not on this branch's console yet: those requests
go to a real local HTTP server that records them (tests/cli/conftest.py's RecordingConsole)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
import tarfile
from pathlib import Path

import pytest

from workers.cli.errors import UsageError
from workers.cli.main import SUBMIT_EPILOG
from workers.cli.spec import build_spec, load_spec_file, parse_env, parse_git

JOB = {"id": 7, "name": "train", "team": "vision", "state": "queued"}
SNAPSHOT = "6f1d3c1e-2b7a-4c55-9d7e-0a1b2c3d4e5f"


def dry_run(gpuctl, *argv: str) -> dict:
    result = gpuctl("submit", "--dry-run", *argv)
    assert result.code == 0, result.err
    return json.loads(result.out)


# --- arguments and the spec


def test_container_flags_go_into_the_spec(gpuctl, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-my-shell")
    spec = dry_run(gpuctl, "--gpus", "1", "--image", "localhost/train:2", "--env", "EPOCHS=3", "--env",
                   "EMPTY=", "--env", "WITH_EQUALS=a=b", "--env", "WANDB_PROJECT", "--secret", "WANDB_API_KEY",
                   "--secret", "HF_TOKEN", "--mount", "imagenet", "--shm-gb", "8", "--git",
                   "https://git.example.org/vision/resnet.git@v2", "--", "python", "train.py")
    assert spec == {
        "gpus": 1, "image": "localhost/train:2", "shm_gb": 8.0,
        "env": {"EPOCHS": "3", "EMPTY": "", "WITH_EQUALS": "a=b", "WANDB_PROJECT": "from-my-shell"},
        "secrets": ["WANDB_API_KEY", "HF_TOKEN"], "mounts": ["imagenet"],
        "code": {"git": {"url": "https://git.example.org/vision/resnet.git", "ref": "v2"}},
        "workload": {"command": ["python", "train.py"]}, "name": "python",
    }


@pytest.mark.parametrize(("text", "expected"), [
    ("https://git.example.org/a/b.git", {"url": "https://git.example.org/a/b.git"}),
    ("https://git.example.org/a/b.git@main", {"url": "https://git.example.org/a/b.git", "ref": "main"}),
    ("https://git.example.org/a/b@feature/x", {"url": "https://git.example.org/a/b", "ref": "feature/x"}),
    ("git@github.com:org/repo.git", {"url": "git@github.com:org/repo.git"}),
    ("git@github.com:org/repo.git@3f2c1ab", {"url": "git@github.com:org/repo.git", "ref": "3f2c1ab"}),
    ("ssh://git@host.example.org/org/repo", {"url": "ssh://git@host.example.org/org/repo"}),
    ("ssh://git@host.example.org/org/repo@v1.2", {"url": "ssh://git@host.example.org/org/repo", "ref": "v1.2"}),
    ("/srv/git/repo@main", {"url": "/srv/git/repo", "ref": "main"}),
])
def test_git_urls_and_refs(text, expected):
    assert parse_git(text) == expected


def test_env_names_are_checked():
    assert parse_env("A_1=x", {}) == ("A_1", "x")
    assert parse_env("HOME", {"HOME": "/root"}) == ("HOME", "/root")
    for bad in ("1A=x", "=x", "A-B=x", "A B=x", ""):
        with pytest.raises(UsageError, match="NAME=VALUE"):
            parse_env(bad, {})
    with pytest.raises(UsageError, match="UNSET_HERE is not set here"):
        parse_env("UNSET_HERE", {})


@pytest.mark.parametrize("argv", [
    ["--env", "1BAD=x"],
    ["--shm-gb", "0"],
    ["--shm-gb", "lots"],
    ["--code", ".", "--git", "https://x.org/a.git"],  # one source of code
    ["--secret", " "],
])
def test_bad_container_flags_exit_2(gpuctl, argv):
    result = gpuctl("submit", "--dry-run", "--gpus", "1", *argv, "--", "true")
    assert result.code == 2, result.err


def test_a_spec_file_with_the_container_fields_and_flags_on_top(gpuctl, tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "train.py").write_text("print('hi')\n")
    spec_file = project / "job.yaml"
    spec_file.write_text(
        "name: resnet\nteam: vision\ngpus: 2\nimage: localhost/train:1\n"
        "env: {EPOCHS: 3, FAST: true, LR: 0.1, KEEP: x}\nsecrets: [WANDB_API_KEY]\nmounts: [imagenet]\n"
        "code: src\nshm_gb: 4\ncpus: 8\nmemory_gb: 32\nworkload: {command: [python, train.py]}\n")
    monkeypatch.chdir(tmp_path)  # `code: src` is relative to the file, not to where gpuctl runs
    assert load_spec_file(str(spec_file))["code"] == str(project / "src")
    result = gpuctl("submit", "--dry-run", "-f", spec_file, "--image", "localhost/train:2", "--env", "EPOCHS=5",
                    "--secret", "HF_TOKEN", "--secret", "WANDB_API_KEY", "--mount", "scratch", "--shm-gb", "16")
    assert result.code == 0, result.err
    spec = json.loads(result.out)
    assert spec["image"] == "localhost/train:2" and spec["shm_gb"] == 16
    assert spec["env"] == {"EPOCHS": "5", "FAST": "true", "LR": "0.1", "KEEP": "x"}
    assert spec["secrets"] == ["WANDB_API_KEY", "HF_TOKEN"] and spec["mounts"] == ["imagenet", "scratch"]
    assert (spec["cpus"], spec["memory_gb"]) == (8, 32)
    assert spec["code"]["snapshot"].startswith("(not uploaded: sha256 ")  # packed, not sent
    assert re.search(r"Packed .*src: 1 files, 12 B \(\d+ B compressed\), sha256 [0-9a-f]{64}", result.err)

    git = json.loads(gpuctl("submit", "--dry-run", "-f", spec_file, "--git", "https://x.org/a.git@dev").out)
    assert git["code"] == {"git": {"url": "https://x.org/a.git", "ref": "dev"}}


@pytest.mark.parametrize(("text", "message"), [
    ("env: [A=1]\n", "env must be a mapping"),
    ("env: {A: [1]}\n", "env.A: a variable's value is a string"),
    ("secrets: WANDB\n", "secrets must be a list of names"),
    ("mounts: [1, 2]\n", "mounts must be a list of names"),
    ("code: 3\n", "code must be a folder to pack"),
    ("imgae: x\n", "unknown field"),
])
def test_bad_container_fields_in_a_spec_file(tmp_path, text, message):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_spec_file(str(path))


def test_the_spec_format_in_submit_help_is_a_valid_spec(tmp_path):
    example = SUBMIT_EPILOG.split("\n\nexamples:")[0].split("\n", 2)[2]
    path = tmp_path / "job.yaml"
    path.write_text(example)
    spec = build_spec(load_spec_file(str(path)), {})
    assert spec["image"] and spec["secrets"] == ["WANDB_API_KEY"] and spec["env"]["EPOCHS"] == "3"
    assert spec["code"] == str(tmp_path / ".")


# --- --code against a recording console


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("import workers.runtime\nprint('training')\n")
    (root / ".gitignore").write_text("data/\n")
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    return root


def snapshot_answer(request) -> tuple[int, dict]:
    form = request.form()
    archive = form["archive"][1]
    return 201, {"id": SNAPSHOT, "team": form["team"][1].decode(), "sha256": hashlib.sha256(archive).hexdigest(),
                 "size": len(archive), "files": 1, "created_at": "2026-12-03T05:00:00Z"}


def test_submit_code_packs_uploads_and_submits_the_snapshot(gpuctl, recorder, project):
    recorder.routes["POST /api/v1/code-snapshots/"] = snapshot_answer
    recorder.routes["POST /api/v1/jobs/"] = (201, JOB)
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--image", "localhost/train:2", "--code",
                    project, "--", "python", "train.py")
    assert result.code == 0, result.err
    (upload,) = recorder.sent("POST", "/api/v1/code-snapshots/")
    assert upload.headers["authorization"] == "Bearer test-token"
    form = upload.form()
    assert form["team"] == (None, b"vision")
    filename, archive = form["archive"]
    assert filename == "code.tar.gz"
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == [".gitignore", "train.py"]  # data/ is ignored
    digest = hashlib.sha256(archive).hexdigest()
    assert f"sha256 {digest}" in result.err and f"Uploaded code snapshot {SNAPSHOT} to team vision" in result.err
    assert "2 files" in result.err

    (submitted,) = recorder.sent("POST", "/api/v1/jobs/")
    assert submitted.json() == {"team": "vision", "gpus": 1, "image": "localhost/train:2",
                                "code": {"snapshot": SNAPSHOT}, "workload": {"command": ["python", "train.py"]},
                                "name": "python"}
    assert result.out.startswith("Submitted job 7")
    assert [r.path for r in recorder.requests] == ["/api/v1/code-snapshots/", "/api/v1/jobs/"]


def test_submit_code_finds_the_team_when_the_user_has_one(gpuctl, recorder, project):
    teams = {"count": 1, "next": None, "results": [{"id": 1, "slug": "vision", "name": "Vision"}]}
    recorder.routes["GET /api/v1/teams/"] = (200, teams)
    recorder.routes["POST /api/v1/code-snapshots/"] = snapshot_answer
    recorder.routes["POST /api/v1/jobs/"] = (201, JOB)
    result = gpuctl("submit", "-q", "--gpus", "1", "--code", project, "--", "python", "train.py")
    assert result.code == 0, result.err
    assert result.out == "7\n" and "Packed" not in result.err  # -q: the job id only
    assert recorder.sent("POST", "/api/v1/code-snapshots/")[0].form()["team"] == (None, b"vision")
    assert recorder.sent("POST", "/api/v1/jobs/")[0].json()["team"] == "vision"

    teams["results"].append({"id": 2, "slug": "nlp", "name": "NLP"})
    teams["count"] = 2
    result = gpuctl("submit", "--gpus", "1", "--code", project, "--", "python", "train.py")
    assert result.code == 2
    assert "give --team (one of vision, nlp)" in result.err
    assert len(recorder.sent("POST", "/api/v1/code-snapshots/")) == 1  # nothing uploaded the second time


def test_a_refused_upload_prints_its_field_errors_and_exits_2(gpuctl, recorder, project):
    recorder.routes["POST /api/v1/code-snapshots/"] = (400, {"archive": ["The archive is over 100 MiB."],
                                                             "team": ["You may not upload to team nlp."]})
    result = gpuctl("submit", "--team", "nlp", "--gpus", "1", "--code", project, "--", "python", "train.py")
    assert result.code == 2
    assert "archive: The archive is over 100 MiB." in result.err
    assert "team: You may not upload to team nlp." in result.err
    assert not recorder.sent("POST", "/api/v1/jobs/")


def test_a_snapshot_stored_with_another_digest_is_not_submitted(gpuctl, recorder, project):
    recorder.routes["POST /api/v1/code-snapshots/"] = (201, {"id": SNAPSHOT, "sha256": "0" * 64})
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--code", project, "--", "python", "train.py")
    assert result.code == 1
    assert "the upload was altered" in result.err
    assert not recorder.sent("POST", "/api/v1/jobs/")


def test_code_past_the_cap_is_refused_before_anything_is_sent(gpuctl, recorder, project, monkeypatch):
    monkeypatch.setattr("workers.cli.code.MAX_BYTES", 10)
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--code", project, "--", "python", "train.py")
    assert result.code == 2
    assert "over the cap of 10 B compressed" in result.err and "largest files: train.py" in result.err
    assert recorder.requests == []


def test_code_that_is_no_folder_is_a_clear_error(gpuctl, recorder, tmp_path):
    result = gpuctl("submit", "--team", "vision", "--gpus", "1", "--code", tmp_path / "nope", "--", "true")
    assert result.code == 1 and "is not a directory" in result.err
    assert recorder.requests == []


# --- gpuctl secret against a recording console

SECRETS = "/api/v1/teams/vision/secrets/"


def test_secret_create_reads_the_value_from_stdin_never_from_argv(gpuctl, recorder):
    # The console shows the value once, in this answer: gpuctl does not print it.
    recorder.routes[f"POST {SECRETS}"] = (201, {"name": "WANDB_API_KEY", "version": 1, "value": "s3cr3t-value",
                                                "created_at": "2026-12-03T05:00:00Z"})
    result = gpuctl("secret", "create", "WANDB_API_KEY", "--team", "vision", stdin="s3cr3t-value\n")
    assert result.code == 0, result.err
    (sent,) = recorder.sent("POST", SECRETS)
    assert sent.json() == {"name": "WANDB_API_KEY", "value": "s3cr3t-value"}  # the typed line end dropped
    assert "s3cr3t" not in result.out + result.err
    assert "--secret WANDB_API_KEY" in result.out
    # There is no option that takes the value on the command line.
    assert gpuctl("secret", "create", "X", "--team", "vision", "--value", "v").code == 2


def test_secret_from_a_file_keeps_its_contents_exactly(gpuctl, recorder, tmp_path):
    recorder.routes[f"POST {SECRETS}"] = (201, {"name": "KEY"})
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN KEY-----\nabc\n-----END KEY-----\n")
    assert gpuctl("secret", "create", "KEY", "--team", "vision", "--from-file", key).code == 0
    assert recorder.sent("POST", SECRETS)[0].json()["value"] == key.read_text()
    missing = gpuctl("secret", "create", "KEY", "--team", "vision", "--from-file", tmp_path / "nope")
    assert missing.code == 2 and "--from-file" in missing.err
    empty = gpuctl("secret", "create", "KEY", "--team", "vision", stdin="")
    assert empty.code == 2 and "is empty" in empty.err
    assert len(recorder.sent("POST", SECRETS)) == 1


def test_secret_prompts_without_echo_on_a_terminal(gpuctl, recorder, monkeypatch):
    recorder.routes[f"PUT {SECRETS}WANDB_API_KEY/"] = (200, {"name": "WANDB_API_KEY"})
    prompts: list[str] = []

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(""))
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or "rotated-value")
    result = gpuctl("secret", "rotate", "WANDB_API_KEY", "--team", "vision")
    assert result.code == 0, result.err
    assert prompts == ["Value of secret WANDB_API_KEY (not shown): "]
    assert recorder.sent("PUT", f"{SECRETS}WANDB_API_KEY/")[0].json() == {"value": "rotated-value"}
    assert "Rotated secret WANDB_API_KEY of team vision" in result.out


def test_secret_list_and_delete(gpuctl, recorder):
    recorder.routes[f"GET {SECRETS}"] = (200, [
        {"name": "HF_TOKEN", "version": 2, "created_by": "mia", "created_at": "2026-12-01T10:00:00Z",
         "rotated_at": "2026-12-02T11:00:00Z"},
        {"name": "WANDB_API_KEY", "version": 1, "created_by": "mia", "created_at": "2026-12-01T10:00:00Z",
         "rotated_at": None}])
    recorder.routes[f"DELETE {SECRETS}HF_TOKEN/"] = (204, None)
    listed = gpuctl("secret", "list", "--team", "vision")
    assert listed.code == 0, listed.err
    lines = listed.out.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "CREATED", "BY", "ROTATED"]
    assert lines[1].split()[:2] == ["HF_TOKEN", "2"] and lines[1].endswith("2026-12-02 11:00:00 UTC")
    assert lines[2].split()[-1] == "-"
    assert json.loads(gpuctl("secret", "list", "--team", "vision", "--json").out)[1]["name"] == "WANDB_API_KEY"
    deleted = gpuctl("secret", "delete", "HF_TOKEN", "--team", "vision")
    assert deleted.code == 0 and "Deleted secret HF_TOKEN of team vision" in deleted.out
    assert len(recorder.sent("DELETE", f"{SECRETS}HF_TOKEN/")) == 1


def test_secret_errors(gpuctl, recorder):
    recorder.routes[f"POST {SECRETS}"] = (400, {"name": ["Use letters, digits and _ only."]})
    refused = gpuctl("secret", "create", "bad-name", "--team", "vision", stdin="v")
    assert refused.code == 2 and "name: Use letters, digits and _ only." in refused.err
    recorder.routes[f"PUT {SECRETS}NOPE/"] = (404, {"detail": "Not found."})
    assert gpuctl("secret", "rotate", "NOPE", "--team", "vision", stdin="v").code == 1
    recorder.routes[f"POST {SECRETS}"] = (403, {"detail": "Only the team's managers manage its secrets."})
    denied = gpuctl("secret", "create", "X", "--team", "vision", stdin="v")
    assert denied.code == 1 and "Only the team's managers" in denied.err
    assert gpuctl("secret").code == 2  # no action
    assert gpuctl("secret", "create", "--team", "vision").code == 2  # no name


def test_status_shows_the_image_code_and_names_never_values():
    from workers.cli.output import job_detail

    job = {**JOB, "kind": "train", "gpus": 1, "priority": "normal", "preset": "ddp",
           "workload": {"command": ["python", "train.py"]}, "image": "localhost/train:2",
           "resolved_image": "localhost/train@sha256:abc", "backend": "podman",
           "code": {"snapshot": SNAPSHOT, "download": f"/api/v1/code-snapshots/{SNAPSHOT}/download/"},
           "env": {"EPOCHS": "3", "PLAIN": "visible-value"}, "secrets": ["WANDB_API_KEY"], "mounts": ["imagenet"]}
    text = job_detail(job)
    assert "image:        localhost/train:2 (ran localhost/train@sha256:abc)" in text
    assert "backend:      podman" in text and f"code:         snapshot {SNAPSHOT}" in text
    assert "env:          EPOCHS, PLAIN" in text and "visible-value" not in text
    assert "secrets:      WANDB_API_KEY" in text and "mounts:       imagenet" in text
    git = job_detail({**JOB, "code": {"git": {"url": "https://x.org/a.git", "ref": "main",
                                              "commit": "1a2b3c4d5e6f7a8b9c0d"}}})
    assert "code:         https://x.org/a.git @ 1a2b3c4d5e6f (main)" in git
