"""The artifact store: directory and S3-compatible implementations, path-traversal rejection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.runtime.artifacts import (
    LocalArtifactStore,
    S3ArtifactStore,
    artifact_store_from_url,
    safe_relpath,
)

BAD_PATHS = ["../escape.txt", "a/../../escape.txt", "..", "/etc/passwd", "a\\..\\b", "C:/x", "", "a/\x00b", "./."]
BAD_JOB_IDS = ["..", "../other", "a/b", "", "."]


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def exercise(store, tmp_path: Path) -> None:
    src = write(tmp_path / "weights.bin", b"\x00\x01weights")
    store.put("job-1", "model.pt", src)
    store.put("job-1", "logs/train.log", write(tmp_path / "log.txt", b"step 1\n"))
    store.put("job-2", "model.pt", write(tmp_path / "other.bin", b"other"))
    assert store.list("job-1") == [("logs/train.log", 7), ("model.pt", 9)]
    assert store.list("job-3") == []
    with store.open("job-1", "model.pt") as fh:
        assert fh.read() == b"\x00\x01weights"
    dest = store.get_to("job-1", "logs/train.log", tmp_path / "down" / "train.log")
    assert dest.read_bytes() == b"step 1\n"
    with pytest.raises(FileNotFoundError):
        store.open("job-1", "missing.pt")
    with pytest.raises(FileNotFoundError):
        store.get_to("job-1", "missing.pt", tmp_path / "down" / "missing.pt")
    for bad in BAD_PATHS:
        with pytest.raises(ValueError):
            store.put("job-1", bad, src)
        with pytest.raises(ValueError):
            store.open("job-1", bad)
        with pytest.raises(ValueError):
            store.get_to("job-1", bad, tmp_path / "x")
    for bad in BAD_JOB_IDS:
        with pytest.raises(ValueError):
            store.put(bad, "model.pt", src)
        with pytest.raises(ValueError):
            store.list(bad)


def test_local_store(tmp_path) -> None:
    root = tmp_path / "store"
    exercise(LocalArtifactStore(root), tmp_path)
    assert (root / "job-1" / "logs" / "train.log").exists()
    assert not (tmp_path / "escape.txt").exists()


def test_local_store_rejects_symlinks_out_of_the_job(tmp_path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    store.put("job-1", "a.txt", write(tmp_path / "a.txt", b"a"))
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, tmp_path / "store" / "job-1" / "link")
    with pytest.raises(ValueError, match="escapes"):
        store.put("job-1", "link/evil.txt", tmp_path / "a.txt")
    assert not (outside / "evil.txt").exists()


def test_put_dir_uploads_an_output_directory(tmp_path) -> None:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    write(out / "model.pt", b"m")
    write(out / "sub" / "metrics.json", b"{}")
    store = LocalArtifactStore(tmp_path / "store")
    assert store.put_dir("job-1", out) == ["model.pt", "sub/metrics.json"]
    assert [name for name, _ in store.list("job-1")] == ["model.pt", "sub/metrics.json"]


def test_safe_relpath_normalises() -> None:
    assert safe_relpath("./a//b/./c.txt") == "a/b/c.txt"


def test_s3_store_with_moto(tmp_path, fake_s3) -> None:
    store = artifact_store_from_url("s3://artifacts/console/prod")
    assert isinstance(store, S3ArtifactStore)
    exercise(store, tmp_path)
    keys = sorted(o["Key"] for o in fake_s3.list_objects_v2(Bucket="artifacts")["Contents"])
    assert keys == ["console/prod/job-1/logs/train.log", "console/prod/job-1/model.pt", "console/prod/job-2/model.pt"]


def test_factory(tmp_path) -> None:
    assert isinstance(artifact_store_from_url(f"file://{tmp_path}"), LocalArtifactStore)
    assert artifact_store_from_url(f"file://{tmp_path}/a%20b").root == (tmp_path / "a b").resolve()
    assert isinstance(artifact_store_from_url(str(tmp_path)), LocalArtifactStore)
    for bad in ("http://example.com/x", "s3:///no-bucket", "file://otherhost/x", "file://"):
        with pytest.raises(ValueError):
            artifact_store_from_url(bad)


def test_local_store_never_follows_a_link_a_job_planted(tmp_path) -> None:
    """The job's folder swapped for a link, a checkpoint linked to a secret, a FIFO: nothing outside is served."""
    store = LocalArtifactStore(tmp_path / "store")
    secret = write(tmp_path / "agent-token", b"host-token")
    outside = tmp_path / "outside"
    outside.mkdir()
    write(outside / "model.pt", b"outside")
    # The job's whole folder replaced by a link to a folder outside the store.
    (tmp_path / "store").mkdir()
    os.symlink(outside, tmp_path / "store" / "job-9")
    assert store.list("job-9") == []
    with pytest.raises(ValueError, match="escapes"):
        store.open("job-9", "model.pt")
    with pytest.raises(ValueError, match="escapes"):
        store.put("job-9", "model.pt", secret)
    assert (outside / "model.pt").read_bytes() == b"outside"
    # A file of the job's that links to a secret, and a folder link inside its folder.
    store.put("job-1", "outputs/real.txt", write(tmp_path / "r.txt", b"real"))
    os.symlink(secret, tmp_path / "store" / "job-1" / "outputs" / "token.txt")
    os.symlink(outside, tmp_path / "store" / "job-1" / "outputs" / "dir")
    os.mkfifo(tmp_path / "store" / "job-1" / "outputs" / "fifo")
    assert store.list("job-1") == [("outputs/real.txt", 4)]
    with pytest.raises(ValueError, match="link"):
        store.open("job-1", "outputs/token.txt")
    with pytest.raises(ValueError, match="escapes"):
        store.open("job-1", "outputs/dir/model.pt")
    with pytest.raises(IsADirectoryError):
        store.open("job-1", "outputs/fifo")
    # Writing over a planted link replaces the link, never writes through it.
    store.put("job-1", "outputs/token.txt", write(tmp_path / "new.txt", b"new"))
    assert secret.read_bytes() == b"host-token"
    with store.open("job-1", "outputs/token.txt") as handle:
        assert handle.read() == b"new"


def test_put_dir_skips_links(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    write(out / "model.pt", b"m")
    os.symlink(write(tmp_path / "secret", b"s"), out / "secret-link")
    store = LocalArtifactStore(tmp_path / "store")
    assert store.put_dir("job-1", out) == ["model.pt"]
