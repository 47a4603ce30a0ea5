"""A job's code: the uploaded snapshot fetched over the job API, or a git checkout at the recorded commit.

Either lands in a folder of the agent's that becomes CODE_PATH inside the job's container. Every failure raises
CodeError with a reason fit for the job's failure report.
"""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
from pathlib import Path

import httpx

from workers import codepack
from workers.protocol import CODE_SNAPSHOT_MAX_BYTES, CodeSnapshot

FETCH_TIMEOUT_S = 300.0
GIT_TIMEOUT_S = 600.0


class CodeError(Exception):
    """The job's code could not be fetched or unpacked (the job fails with this reason)."""


def fetch(snapshot: CodeSnapshot, dest: Path, *, console_url: str, job_token: str,
          max_bytes: int = CODE_SNAPSHOT_MAX_BYTES) -> str:
    """Put the job's code into `dest` (an empty folder); returns a line for the job's log."""
    if snapshot.kind == "upload":
        return _fetch_upload(snapshot, dest, console_url=console_url, job_token=job_token, max_bytes=max_bytes)
    if snapshot.kind == "git":
        return _checkout(snapshot, dest)
    raise CodeError(f"unknown code snapshot kind {snapshot.kind!r}")


def _fetch_upload(snapshot: CodeSnapshot, dest: Path, *, console_url: str, job_token: str, max_bytes: int) -> str:
    if snapshot.size > max_bytes:
        raise CodeError(f"code snapshot of {snapshot.size} bytes is over the cap of {max_bytes} bytes")
    if not job_token:
        raise CodeError("the dispatch carries no job token to fetch the code snapshot with")
    url = snapshot.url if snapshot.url.startswith(("http://", "https://")) else console_url.rstrip("/") + snapshot.url
    archive = dest.parent / f"{dest.name}.tar.gz"
    digest = hashlib.sha256()
    size = 0
    try:
        with httpx.stream("GET", url, headers={"Authorization": f"Job {job_token}"}, timeout=FETCH_TIMEOUT_S,
                          follow_redirects=False) as response, open(archive, "wb") as out:
            if response.status_code != 200:
                raise CodeError(f"could not fetch the code snapshot: the console answered {response.status_code}")
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise CodeError(f"code snapshot is over the cap of {max_bytes} bytes")
                digest.update(chunk)
                out.write(chunk)
    except httpx.HTTPError as exc:
        raise CodeError(f"could not fetch the code snapshot from {url}: {exc}") from None
    try:
        if snapshot.size and size != snapshot.size:
            raise CodeError(f"code snapshot is {size} bytes, the console recorded {snapshot.size}")
        if snapshot.sha256 and digest.hexdigest() != snapshot.sha256.lower():
            raise CodeError(f"code snapshot's sha256 {digest.hexdigest()} is not the recorded {snapshot.sha256}")
        _unpack(archive, dest, max_bytes)
    finally:
        archive.unlink(missing_ok=True)
    return f"code snapshot of {size} bytes (sha256 {digest.hexdigest()[:12]}) unpacked"


def _unpack(archive: Path, dest: Path, max_bytes: int) -> None:
    try:
        codepack.unpack(archive, dest, max_bytes)  # tarfile's "data" filter, caps on size and file count
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise CodeError(f"could not unpack the code snapshot: {exc}") from None


def _checkout(snapshot: CodeSnapshot, dest: Path) -> str:
    commit = snapshot.commit or snapshot.ref
    if not commit:
        raise CodeError("git code names no commit or ref")
    if commit.startswith("-") or snapshot.url.startswith("-"):
        raise CodeError("git url and commit must not start with '-'")
    steps = (("clone", ["git", "clone", "--quiet", "--no-checkout", "--", snapshot.url, str(dest)]),
             ("checkout", ["git", "-C", str(dest), "-c", "advice.detachedHead=false", "checkout", "--quiet", commit,
                           "--"]))
    for step, argv in steps:
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
                                    env={"PATH": "/usr/bin:/bin", "GIT_TERMINAL_PROMPT": "0", "HOME": str(dest.parent)})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CodeError(f"git {step} of {snapshot.url} failed: {exc}") from None
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise CodeError(f"git {step} of {snapshot.url} at {commit} failed: {detail}")
    return f"git checkout of {snapshot.url} at {commit}"
