"""Code snapshots: a team's uploaded code (a tar.gz), checked, stored in the artifact store, and served to its
team and to the agent of a job that starts in it (issue 16).

The archive is checked as the agent will unpack it: a gzip'd tar of regular files, folders and links that stay
inside it, no absolute paths, no '..', no devices; at most CODE_SNAPSHOT_MAX_BYTES packed.
"""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import IO

from django.conf import settings
from django.contrib.auth.models import User

from apps.accounts import access
from apps.accounts.access import Action
from apps.accounts.models import Team
from apps.core.errors import InvalidInput
from apps.jobs.models import CodeSnapshot
from workers.codepack import CODE_SNAPSHOT_MAX_FILES as MAX_ENTRIES
from workers.codepack import CODE_SNAPSHOT_MAX_UNPACKED_BYTES as MAX_UNPACKED_BYTES
from workers.protocol import CODE_SNAPSHOT_MAX_BYTES
from workers.runtime.artifacts import ArtifactStore, artifact_store_from_url

# Where the archives live in the artifact store (job artifacts live under numeric job ids: no clash).
CODE_SNAPSHOT_NAMESPACE = "code-snapshots"
# Unpacked, an archive may hold at most MAX_UNPACKED_BYTES and MAX_ENTRIES (gpuctl and the agent use the same
# bounds, workers/codepack.py): a gzip bomb is refused while it is read.


def artifact_store() -> ArtifactStore:
    return artifact_store_from_url(settings.ARTIFACT_STORE_URL)


def archive_name(snapshot_id: uuid.UUID | str) -> str:
    return f"{snapshot_id}.tar.gz"


def _refuse(message: str) -> InvalidInput:
    return InvalidInput({"archive": [message]})


def check_archive(path: str) -> int:
    """The number of files in the tar.gz at `path`; InvalidInput naming `archive` for anything the agent must
    not unpack."""
    files = entries = unpacked = 0
    try:
        with tarfile.open(path, mode="r:gz") as archive:
            for member in archive:
                entries += 1
                unpacked += max(0, member.size)
                if entries > MAX_ENTRIES or unpacked > MAX_UNPACKED_BYTES:
                    raise _refuse(f"Unpacked, an archive may hold at most {MAX_ENTRIES} entries and "
                                  f"{MAX_UNPACKED_BYTES // 1024**3} GiB.")
                _check_member(member)
                files += member.isfile()
    except (tarfile.TarError, EOFError, OSError) as exc:  # gzip.BadGzipFile is an OSError
        raise _refuse(f"Not a tar.gz archive ({str(exc)[:120] or type(exc).__name__}).") from None
    if entries == 0:
        raise _refuse("The archive is empty.")
    return files


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or "\x00" in name:
        raise _refuse(f"'{name[:200]}': an archive's paths are relative.")
    if ".." in PurePosixPath(name).parts:
        raise _refuse(f"'{name[:200]}': no '..' in an archive's paths.")
    try:
        # The standard library's rule for untrusted archives: no absolute paths, nothing (or no link target)
        # outside the destination, no devices or pipes.
        tarfile.data_filter(member, "/code")
    except tarfile.FilterError as exc:
        raise _refuse(f"'{name[:200]}': {exc}") from None


def _spool(chunks: Iterable[bytes], spool: IO[bytes]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        size += len(chunk)
        if size > CODE_SNAPSHOT_MAX_BYTES:
            raise _refuse(f"An archive may hold at most {CODE_SNAPSHOT_MAX_BYTES // 1024**2} MiB.")
        digest.update(chunk)
        spool.write(chunk)
    spool.flush()
    return digest.hexdigest(), size


def code_snapshot_create(*, user: User, team_slug: str, chunks: Iterable[bytes]) -> CodeSnapshot:
    """Check and store an uploaded archive for `team_slug` (members of the team, who may submit there)."""
    team = access.restrict(Team.objects.all(), user).filter(slug=team_slug).first()
    if team is None:
        raise InvalidInput({"team": [f"You are not a member of a team named '{team_slug}'."]})
    access.require(user, Action.SUBMIT, team)
    with tempfile.NamedTemporaryFile(prefix="code-snapshot-", suffix=".tar.gz") as spool:
        sha256, size = _spool(chunks, spool)
        files = check_archive(spool.name)
        snapshot = CodeSnapshot(team=team, user=user, sha256=sha256, size=size, files=files)
        artifact_store().put(CODE_SNAPSHOT_NAMESPACE, archive_name(snapshot.pk), spool.name)
    snapshot.save(force_insert=True)
    return snapshot


def code_snapshot_open(snapshot_id: uuid.UUID | str) -> IO[bytes]:
    """The stored archive (FileNotFoundError when the store lost it)."""
    return artifact_store().open(CODE_SNAPSHOT_NAMESPACE, archive_name(snapshot_id))
