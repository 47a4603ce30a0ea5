"""Code snapshots: upload (checked as the agent will unpack it), metadata and download for the team only, and the
job API's copy for the agent of a job that starts in it (its attempt's job token, no other)."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest
from rest_framework.test import APIClient

from apps.cluster.models import Host
from apps.cluster.services import host_token_issue
from apps.jobs import services
from apps.jobs.models import CodeSnapshot, Job
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from tests.cluster.test_agent_api import agent, registration
from tests.jobs.conftest import tar_gz, upload
from workers.protocol import CODE_SNAPSHOT_MAX_BYTES, JOB_CODE_PATH

ARCHIVE = tar_gz({"main.py": b"print('hi')\n", "pkg/util.py": b"X = 1\n"})


@pytest.fixture(autouse=True)
def store(settings, tmp_path):
    settings.ARTIFACT_STORE_URL = (tmp_path / "artifacts").as_uri()
    return tmp_path / "artifacts"


def client(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_a_member_uploads_and_the_team_reads_it_back(world, store):
    response = upload(world.member, "vision", ARCHIVE)
    assert response.status_code == 201, response.content
    body = response.json()
    assert {k: body[k] for k in ("team", "user", "sha256", "size", "files")} == {
        "team": "vision", "user": "mia", "sha256": hashlib.sha256(ARCHIVE).hexdigest(), "size": len(ARCHIVE),
        "files": 2}
    assert (store / "code-snapshots" / f"{body['id']}.tar.gz").read_bytes() == ARCHIVE
    for reader in (world.member, world.member2, world.viewer, world.manager, world.admin):
        assert client(reader).get(f"/api/v1/code-snapshots/{body['id']}/").json() == body
        download = client(reader).get(f"/api/v1/code-snapshots/{body['id']}/download/")
        assert download.status_code == 200 and b"".join(download.streaming_content) == ARCHIVE
        assert download["X-Content-SHA256"] == body["sha256"]
    for outsider in (world.other, world.noteam):
        assert client(outsider).get(f"/api/v1/code-snapshots/{body['id']}/").status_code == 404
        assert client(outsider).get(f"/api/v1/code-snapshots/{body['id']}/download/").status_code == 404
    assert APIClient().get(f"/api/v1/code-snapshots/{body['id']}/").status_code == 401


def test_the_s3_store_keeps_snapshots_too(world, settings, fake_s3):
    settings.ARTIFACT_STORE_URL = "s3://artifacts/console"
    response = upload(world.member, "vision", ARCHIVE)
    assert response.status_code == 201, response.content
    key = f"console/code-snapshots/{response.json()['id']}.tar.gz"
    assert fake_s3.get_object(Bucket="artifacts", Key=key)["Body"].read() == ARCHIVE
    download = client(world.member).get(f"/api/v1/code-snapshots/{response.json()['id']}/download/")
    assert b"".join(download.streaming_content) == ARCHIVE


@pytest.mark.parametrize(("user", "team", "status", "field"), [
    ("viewer", "vision", 403, None),  # viewers do not submit jobs
    ("other", "vision", 400, "team"),  # not a member: no such team for them
    ("noteam", "vision", 400, "team"),
    ("member", "no-such", 400, "team"),
])
def test_only_those_who_submit_in_the_team_upload(world, user, team, status, field):
    response = upload(getattr(world, user), team, ARCHIVE)
    assert response.status_code == status, response.content
    if field:
        assert field in response.json()
    assert not CodeSnapshot.objects.exists()


def _tar(add) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        add(archive)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", data: bytes = b"") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, len(data)
    return info


def _with(*members: tarfile.TarInfo) -> bytes:
    return _tar(lambda archive: [archive.addfile(m, io.BytesIO(b"")) for m in members])


BAD_ARCHIVES = {
    "not gzip": b"just some bytes",
    "gzip, not tar": __import__("gzip").compress(b"not a tar" * 100),
    "empty": _tar(lambda archive: None),
    "absolute path": _with(_member("/etc/passwd")),
    "dot-dot": _with(_member("a/../../x")),
    "dot-dot inside": _with(_member("a/../b")),
    "symlink out": _with(_member("link", tarfile.SYMTYPE, "../../etc/passwd")),
    "absolute symlink": _with(_member("link", tarfile.SYMTYPE, "/etc/passwd")),
    "hard link out": _with(_member("link", tarfile.LNKTYPE, "../outside")),
    "device": _with(_member("dev", tarfile.CHRTYPE)),
    "fifo": _with(_member("fifo", tarfile.FIFOTYPE)),
}


@pytest.mark.parametrize("name", list(BAD_ARCHIVES))
def test_an_archive_the_agent_must_not_unpack_is_a_400_naming_archive(world, store, name):
    response = upload(world.member, "vision", BAD_ARCHIVES[name])
    assert response.status_code == 400, response.content
    assert "archive" in response.json(), response.json()
    assert not CodeSnapshot.objects.exists() and not (store / "code-snapshots").exists()


def test_links_inside_the_archive_are_fine(world):
    archive = _tar(lambda a: [a.addfile(_member("dir", tarfile.DIRTYPE)),
                              a.addfile(_member("dir/f.py", data=b"x"), io.BytesIO(b"x")),
                              a.addfile(_member("dir/link.py", tarfile.SYMTYPE, "f.py"))])
    response = upload(world.member, "vision", archive)
    assert response.status_code == 201 and response.json()["files"] == 1


def test_an_archive_over_the_cap_is_refused(world):
    response = upload(world.member, "vision", bytes(CODE_SNAPSHOT_MAX_BYTES + 1))
    assert response.status_code == 400 and "at most 100 MiB" in str(response.json()["archive"])
    missing = client(world.member).post("/api/v1/code-snapshots/", {"team": "vision"}, format="multipart")
    assert missing.status_code == 400 and "archive" in missing.json()


# --- the job API: the agent of the job's attempt fetches its code ------------------------------------------------


@pytest.fixture
def placed(world):
    """Two jobs of team vision started in snapshots, placed on host sim-a; their dispatches and the host's secret."""
    host, secret = host_token_issue(name="sim-a")
    assert agent(secret).post("/api/v1/agent/register/", registration("sim-a"), format="json").status_code == 200
    Host.objects.exclude(name="sim-a").update(state="down")
    snapshot_id = upload(world.member, "vision", ARCHIVE).json()["id"]
    jobs = [job_submit(user=world.member, spec=JobSpec(
        name=f"t{i}", kind="train", gpus=1, team="vision", workload={"command": ["python", "main.py"]},
        code={"snapshot": snapshot_id} if i == 0 else None)) for i in range(2)]
    scheduler_pass()
    dispatches = [services.dispatch_messages(Job.objects.get(pk=job.pk))[0][1] for job in jobs]
    return jobs, dispatches, secret, snapshot_id


def job_client(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Job {token}")
    return api


def test_the_agent_fetches_the_code_with_the_attempts_token(placed):
    jobs, (with_code, without), host_secret, snapshot_id = placed
    code = with_code.container.code
    assert (code.kind, code.url, code.sha256, code.size) == (
        "upload", JOB_CODE_PATH, hashlib.sha256(ARCHIVE).hexdigest(), len(ARCHIVE))
    # Placed (before the agent starts the job) and running alike.
    for _ in range(2):
        response = job_client(with_code.job_token).get(JOB_CODE_PATH)
        assert response.status_code == 200 and b"".join(response.streaming_content) == ARCHIVE
        assert response["X-Content-SHA256"] == code.sha256
        assert agent(host_secret).post(f"/api/v1/agent/jobs/{jobs[0].pk}/status/",
                                       {"state": "running", "attempt": 1}, format="json").status_code == 200
    # The other job has no uploaded code: its own token finds none, and never the first job's.
    assert without.container.code is None
    assert job_client(without.job_token).get(JOB_CODE_PATH).status_code == 404
    # Refused: no token, a host's token, a forged one, a person.
    assert APIClient().get(JOB_CODE_PATH).status_code in (401, 403)
    assert agent(host_secret).get(JOB_CODE_PATH).status_code == 401
    assert job_client(with_code.job_token + "x").get(JOB_CODE_PATH).status_code == 401


def test_the_code_token_ends_with_its_attempt(placed):
    jobs, (with_code, _), _, _ = placed
    services.job_cancel(job=Job.objects.get(pk=jobs[0].pk), actor=jobs[0].user, reason="done")
    assert job_client(with_code.job_token).get(JOB_CODE_PATH).status_code == 401
