"""The admin's volumes on this host: where a job's mount comes from and where it lands, checked the same way for
both backends (a container's --mount, a process job's view). A source outside the agent's --volume-root list, a
missing one, or a target on or in a path the system or the agent lays out, fails the job saying which."""

from __future__ import annotations

import os
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


def resolve(mount: MountSpec, roots: tuple[Path, ...]) -> Bind:
    """The mount as this host binds it, or VolumeError saying why not."""
    source = Path(os.path.realpath(mount.source))
    real_roots = [Path(os.path.realpath(root)) for root in roots]
    if not any(source == root or root in source.parents for root in real_roots):
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
    return Bind(mount.name, source, target, mount.read_only)


def described(bind: Bind) -> str:
    return f"volume {bind.name}: {bind.source} at {bind.target}" + (" (read-only)" if bind.read_only else "")
