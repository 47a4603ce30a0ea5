from __future__ import annotations

import io
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient


def tar_gz(files: dict[str, bytes]) -> bytes:
    """A tar.gz of regular files, by name."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload(user, team: str, archive: bytes, name: str = "code.tar.gz"):
    client = APIClient()
    client.force_authenticate(user)
    return client.post("/api/v1/code-snapshots/", {"team": team, "archive": SimpleUploadedFile(name, archive)},
                       format="multipart")


@pytest.fixture
def snapshot_of(settings, tmp_path):
    """Upload a small code snapshot as `user` for `team`; its id."""
    settings.ARTIFACT_STORE_URL = (tmp_path / "artifacts").as_uri()

    def make(user, team: str) -> str:
        response = upload(user, team, tar_gz({"main.py": b"print('hi')\n"}))
        assert response.status_code == 201, response.content
        return response.json()["id"]

    return make
