"""Where job outputs (weights, metrics, logs) are kept: a directory, or an S3-compatible bucket.

    store = artifact_store_from_url("file:///var/lib/console/artifacts")   # or "s3://bucket/prefix"
    store.put(job_id, "model.pt", "/tmp/out/model.pt")
    store.list(job_id)  ->  [("model.pt", 123456)]
    with store.open(job_id, "model.pt") as fh: ...
    store.get_to(job_id, "model.pt", "/tmp/in/model.pt")

Job ids and relative paths come from users: anything that could leave the job's own area (`..`,
absolute paths, backslashes, empty parts) is rejected with ValueError.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import shutil
import stat
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import unquote, urlparse


def _check_part(value: str, what: str) -> None:
    if not value or value in (".", "..") or "\x00" in value:
        raise ValueError(f"invalid {what}: {value!r}")


def safe_job_id(job_id: str) -> str:
    job_id = str(job_id)
    _check_part(job_id, "job id")
    if "/" in job_id or "\\" in job_id:
        raise ValueError(f"invalid job id: {job_id!r}")
    return job_id


def safe_relpath(relpath: str) -> str:
    """`relpath` normalised to 'a/b/c'; ValueError if it is absolute or climbs out with '..'."""
    if not isinstance(relpath, str) or not relpath:
        raise ValueError("artifact path must be a non-empty string")
    if "\\" in relpath or relpath.startswith("/") or (len(relpath) > 1 and relpath[1] == ":"):
        raise ValueError(f"artifact path must be relative: {relpath!r}")
    parts = [p for p in PurePosixPath(relpath).parts if p != "."]
    if not parts:
        raise ValueError(f"invalid artifact path: {relpath!r}")
    for part in parts:
        _check_part(part, "artifact path component")
    return "/".join(parts)


class ArtifactStore(ABC):
    @abstractmethod
    def put(self, job_id: str, relpath: str, src_file: str | os.PathLike[str]) -> None:
        """Store the file `src_file` as `relpath` of job `job_id` (overwriting)."""

    @abstractmethod
    def list(self, job_id: str) -> list[tuple[str, int]]:
        """(relpath, size in bytes) of every artifact of the job, sorted by path."""

    def list_page(self, job_id: str, *, after: str = "", limit: int) -> list[tuple[str, int]]:
        """At most `limit` of list()'s entries, those whose path sorts after `after` (a job may hold millions)."""
        return [entry for entry in self.list(job_id) if entry[0] > after][:limit]

    @abstractmethod
    def open(self, job_id: str, relpath: str) -> IO[bytes]:
        """A binary file object to read the artifact; FileNotFoundError if absent."""

    def get_to(self, job_id: str, relpath: str, dest: str | os.PathLike[str]) -> Path:
        """Copy the artifact to the local file `dest` (parents created); returns its path."""
        target = Path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        with self.open(job_id, relpath) as src, tmp.open("wb") as out:
            shutil.copyfileobj(src, out)
        os.replace(tmp, target)
        return target

    def put_dir(self, job_id: str, directory: str | os.PathLike[str], prefix: str = "") -> list[str]:
        """Store every file under `directory` (e.g. CONSOLE_OUTPUT_DIR); returns the stored relpaths."""
        root = Path(directory)
        stored = []
        # Regular files only, found without following links: a link in the folder is not stored.
        files = [Path(folder, name) for folder, _, names in os.walk(root) for name in names]
        for path in sorted(p for p in files if stat.S_ISREG(p.lstat().st_mode)):
            relpath = path.relative_to(root).as_posix()
            relpath = f"{prefix.rstrip('/')}/{relpath}" if prefix else relpath
            self.put(job_id, relpath, path)
            stored.append(safe_relpath(relpath))
        return stored


class LocalArtifactStore(ArtifactStore):
    """Artifacts under `root/<job_id>/<relpath>`.

    Jobs write into their own folders here, so any name below `root` may be a link a job planted (its artifact
    folder swapped for a link to /, a checkpoint linked to the host's token). Every path is therefore opened one
    component at a time from a descriptor of `root`, never following a link (O_NOFOLLOW on each component), and
    listings walk descriptors too (os.fwalk): nothing outside the job's folder is ever read or written.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def _open_dir(self, parts: list[str], *, create: bool = False) -> int:
        """A descriptor of root/parts..., each component opened without following links."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o750, dir_fd=fd)
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise ValueError(f"artifact path escapes the job's folder through a link or file: {part!r}") from None
                    raise
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _split(self, job_id: str, relpath: str) -> tuple[list[str], str]:
        parts = [safe_job_id(job_id), *safe_relpath(relpath).split("/")]
        return parts[:-1], parts[-1]

    def put(self, job_id: str, relpath: str, src_file: str | os.PathLike[str]) -> None:
        folders, name = self._split(job_id, relpath)
        dir_fd = self._open_dir(folders, create=True)
        tmp = f".{name}.part"
        try:
            with open(src_file, "rb") as source, open(
                os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640,
                        dir_fd=dir_fd), "wb") as target:
                shutil.copyfileobj(source, target)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # a link named `name` is replaced
        finally:
            os.close(dir_fd)

    def _walk(self, job_id: str) -> Iterator[tuple[str, int]]:
        """(relpath, size) of each regular file of the job, found through descriptors (never follows links)."""
        job = safe_job_id(job_id)
        try:
            dir_fd = self._open_dir([job])
        except (ValueError, FileNotFoundError):
            return  # no folder, or a link in place of it
        try:
            for folder, _, files, folder_fd in os.fwalk(".", dir_fd=dir_fd):
                for name in files:
                    if name.endswith(".part"):
                        continue
                    info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        yield os.path.normpath(os.path.join(folder, name)), info.st_size
        finally:
            os.close(dir_fd)

    def list(self, job_id: str) -> list[tuple[str, int]]:
        return sorted(self._walk(job_id))

    def list_page(self, job_id: str, *, after: str = "", limit: int) -> list[tuple[str, int]]:
        # The walk visits every file, but keeps only `limit` of them in memory.
        return heapq.nsmallest(limit, (entry for entry in self._walk(job_id) if entry[0] > after))

    def open(self, job_id: str, relpath: str) -> IO[bytes]:
        folders, name = self._split(job_id, relpath)
        dir_fd = self._open_dir(folders)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(f"artifact is a link, which could lead out of the job's folder: {relpath!r}") from None
            raise
        finally:
            os.close(dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device a job left would block or leak
            os.close(fd)
            raise IsADirectoryError(f"not a regular file: {relpath!r}")
        os.set_blocking(fd, True)
        return open(fd, "rb")


class S3ArtifactStore(ArtifactStore):
    """Artifacts as objects `<prefix>/<job_id>/<relpath>` in an S3-compatible bucket (needs boto3).

    The endpoint (for MinIO, Ceph...) and credentials come from the usual AWS variables or from
    `client_kwargs`, e.g. {"endpoint_url": "http://minio:9000"}.
    """

    def __init__(self, bucket: str, prefix: str = "", client: Any = None, **client_kwargs: Any) -> None:
        if client is None:
            try:
                import boto3
            except ImportError as exc:
                raise RuntimeError("the s3:// artifact store needs boto3 (pip install boto3)") from exc
            endpoint = client_kwargs.pop("endpoint_url", None) or os.environ.get("CONSOLE_S3_ENDPOINT_URL")
            client = boto3.client("s3", endpoint_url=endpoint, **client_kwargs)
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def _job_prefix(self, job_id: str) -> str:
        job = safe_job_id(job_id)
        return f"{self.prefix}/{job}/" if self.prefix else f"{job}/"

    def _key(self, job_id: str, relpath: str) -> str:
        return self._job_prefix(job_id) + safe_relpath(relpath)

    def put(self, job_id: str, relpath: str, src_file: str | os.PathLike[str]) -> None:
        self.client.upload_file(os.fspath(src_file), self.bucket, self._key(job_id, relpath))

    def list(self, job_id: str) -> list[tuple[str, int]]:
        prefix = self._job_prefix(job_id)
        found = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                found.append((obj["Key"][len(prefix):], int(obj["Size"])))
        return sorted(found)

    def list_page(self, job_id: str, *, after: str = "", limit: int) -> list[tuple[str, int]]:
        # S3 lists keys in order: start after the cursor and stop once the page is full.
        prefix = self._job_prefix(job_id)
        options = {"StartAfter": prefix + after} if after else {}
        found: list[tuple[str, int]] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                          **options):
            for obj in page.get("Contents", []):
                found.append((obj["Key"][len(prefix):], int(obj["Size"])))
                if len(found) >= limit:
                    return found
        return found

    def open(self, job_id: str, relpath: str) -> IO[bytes]:
        key = self._key(job_id, relpath)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except self.client.exceptions.NoSuchKey as exc:
            raise FileNotFoundError(f"s3://{self.bucket}/{key}") from exc
        return response["Body"]

    def get_to(self, job_id: str, relpath: str, dest: str | os.PathLike[str]) -> Path:
        target = Path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        key = self._key(job_id, relpath)
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except self.client.exceptions.ClientError as exc:
            raise FileNotFoundError(f"s3://{self.bucket}/{key}") from exc
        self.client.download_file(self.bucket, key, os.fspath(target))
        return target


def artifact_store_from_url(url: str, **options: Any) -> ArtifactStore:
    """`file:///path` (or a plain path) -> LocalArtifactStore; `s3://bucket/prefix` -> S3ArtifactStore."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URLs must name a local path: {url!r}")
        path = unquote(parsed.path) if parsed.scheme == "file" else url
        if not path:
            raise ValueError(f"no directory in artifact store URL {url!r}")
        return LocalArtifactStore(path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"no bucket in artifact store URL {url!r}")
        return S3ArtifactStore(parsed.netloc, parsed.path, **options)
    raise ValueError(f"unsupported artifact store URL {url!r}: use file:///path or s3://bucket/prefix")
