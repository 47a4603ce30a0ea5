"""The admin's volumes on this host: where a job's mount comes from and where it lands, checked the same way for
both backends (a container's --mount, a process job's view). A source outside the agent's --volume-root list, a
missing one, one a job could swap for a link, or a target on or in a path the system or the agent lays out, fails
the job saying which.

A job could swap the source (or a folder on its way) for a link between this check and the bind, and have another
job's volume show what the link points at, if it may write in a folder on the way from the volume root: a writable
volume above another's source. So every folder from the volume root down to the source's own folder must be
writable by its owner only, and that owner no user jobs run as."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from workers.protocol import RUNTIME_MOUNT_PATH, MountSpec

# Paths a mount may not land on or inside: the system's, and those the agent lays out in a job (a container's
# /workspace and runtime; /run/secrets).
RESERVED_TARGETS = ("/workspace", RUNTIME_MOUNT_PATH, "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib",
                    "/lib64", "/run/secrets")


class VolumeError(ValueError):
    """A mount this host will not give the job; the message is the job's failure reason."""


@dataclass(frozen=True)
class Bind:
    name: str
    source: Path  # resolved: no link in it
    target: PurePosixPath
    read_only: bool


def resolve(mount: MountSpec, roots: tuple[Path, ...], runs_jobs_as: Callable[[int], bool]) -> Bind:
    """The mount as this host binds it, or VolumeError saying why not. `runs_jobs_as(uid)`: whether jobs run as
    that user here."""
    source = Path(os.path.realpath(mount.source))
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    root = next((root for root in real_roots if source == root or root in source.parents), None)
    if root is None:
        named = ", ".join(map(str, real_roots)) or "none configured"
        raise VolumeError(f"mount {mount.name}: {mount.source} is outside this host's volume roots "
                          f"(--volume-root: {named})")
    target = PurePosixPath(os.path.normpath(mount.target))
    reserved = [PurePosixPath(path) for path in RESERVED_TARGETS]
    if not target.is_absolute() or target == PurePosixPath("/") or any(
            target == path or path in target.parents for path in reserved):
        raise VolumeError(f"mount {mount.name}: target {mount.target} is not allowed")
    if not source.exists():
        raise VolumeError(f"mount {mount.name}: {mount.source} does not exist on this host")
    for folder in (f for f in (source.parent, *source.parent.parents) if f.is_relative_to(root)):
        info = folder.lstat()
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or runs_jobs_as(info.st_uid):
            raise VolumeError(f"mount {mount.name}: jobs could write in {folder}, on the way to {source}: a job "
                              "could swap the volume for a link (make the folders from the volume root down to "
                              "the volume writable by root only)")
    return Bind(mount.name, source, target, mount.read_only)


def described(bind: Bind) -> str:
    return f"volume {bind.name}: {bind.source} at {bind.target}" + (" (read-only)" if bind.read_only else "")
