"""Volumes: admins define them (a path on the hosts, where it appears in a job, read-only or not, which teams may use
it); jobs name them, and the console resolves the names into the mounts of the job's dispatch.

The agent binds only what the console sent and, on its side, only sources under its own --volume-root list.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from apps.accounts import access
from apps.accounts.access import AnyUser
from apps.accounts.models import Team
from apps.cluster.models import Volume
from apps.core.errors import InvalidInput
from apps.core.models import AuditEvent
from apps.core.services import audit_record
from workers.protocol import (
    CODE_PATH,
    CONTAINER_CHECKPOINTS,
    CONTAINER_HOME,
    CONTAINER_OUTPUTS,
    RUNTIME_MOUNT_PATH,
    MountSpec,
)

__all__ = ["RESERVED_TARGETS", "audit_volume_change", "default_target", "host_path_problem", "resolve_mounts", "target_problem",
           "validate_mount_names", "volume_create", "volume_delete", "volume_summary", "volume_update", "volumes_usable_by",
           "volumes_visible_to"]

# Paths inside a job that belong to the system or to the console (the job's code, home, checkpoints and outputs
# live under /workspace; the runtime package at RUNTIME_MOUNT_PATH): a volume mounts neither at nor above them.
RESERVED_TARGETS = tuple(dict.fromkeys(("/proc", "/sys", "/dev", "/workspace", CODE_PATH, CONTAINER_HOME,
                                        CONTAINER_CHECKPOINTS, CONTAINER_OUTPUTS, RUNTIME_MOUNT_PATH)))
# Host paths a volume may never expose.
FORBIDDEN_SOURCES = ("/proc", "/sys", "/dev", "/boot", "/etc", "/run", "/var/run", "/root")
_UNSAFE_CHARACTERS = (",", ":", "\n", "\r", "\t", "\x00")  # would break the runtimes' --mount/-v syntax


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _path_problem(path: object) -> str | None:
    if not isinstance(path, str) or not path:
        return "Give an absolute path."
    if not path.startswith("/"):
        return "Give an absolute path (starting with /)."
    if any(c in path for c in _UNSAFE_CHARACTERS):
        return "A path cannot hold commas, colons, tabs, line breaks or NUL characters."
    if ".." in path.split("/"):
        return "A path cannot hold '..'."
    if posixpath.normpath(path) != path or path.startswith("//"):
        return f"Give the path in its normal form: {posixpath.normpath(path)}."
    if path == "/":
        return "Not the root directory."
    return None


def host_path_problem(path: object) -> str | None:
    """Why `path` cannot be a volume's host path, or None."""
    problem = _path_problem(path)
    if problem is None:
        assert isinstance(path, str)
        for root in FORBIDDEN_SOURCES:
            if _under(path, root):
                return f"{root} on the hosts is not for jobs."
    return problem


def target_problem(path: object) -> str | None:
    """Why `path` cannot be where a volume appears inside a job, or None."""
    problem = _path_problem(path)
    if problem is None:
        assert isinstance(path, str)
        for reserved in RESERVED_TARGETS:
            if _under(path, reserved) or _under(reserved, path):
                return f"{reserved} is reserved inside jobs; a volume mounts neither at it, under it nor above it."
    return problem


def default_target(name: str) -> str:
    return f"/mnt/{name}"


def _clean(data: dict[str, Any]) -> None:
    errors = {}
    if "host_path" in data and (problem := host_path_problem(data["host_path"])):
        errors["host_path"] = [problem]
    if "target" in data and (problem := target_problem(data["target"])):
        errors["target"] = [problem]
    if errors:
        raise InvalidInput(errors)


def volumes_visible_to(user: AnyUser) -> QuerySet[Volume]:
    """Admins see every volume; others the volumes one of their teams may use."""
    return access.restrict(Volume.objects.all(), user, access.Action.VIEW)


def volumes_usable_by(team_id: int) -> QuerySet[Volume]:
    """The volumes the team's jobs may mount."""
    return Volume.objects.filter(Q(all_teams=True) | Q(pk__in=Volume.teams.through.objects.filter(
        team_id=team_id).values("volume_id")))


def audit_volume_change(actor: AnyUser, volume: Volume, request: HttpRequest | None, **details: Any) -> None:
    """The audit record of a change to a volume (also the Django admin's, which saves through its own form)."""
    audit_record(AuditEvent.Action.VOLUME_CHANGED, actor=actor, target=f"volume {volume.name}", request=request,
                 **details)


def volume_summary(volume: Volume) -> dict[str, Any]:
    return {"host_path": volume.host_path, "mount_target": volume.target, "read_only": volume.read_only,
            "all_teams": volume.all_teams, "teams": sorted(volume.teams.values_list("slug", flat=True))}


def volume_create(*, actor: AnyUser, name: str, host_path: str, target: str = "", read_only: bool = True,
                  teams: Iterable[Team] = (), all_teams: bool = False, description: str = "",
                  request: HttpRequest | None = None) -> Volume:
    access.require(actor, access.Action.ADMINISTER)
    target = target or default_target(name)
    _clean({"host_path": host_path, "target": target})
    if Volume.objects.filter(name=name).exists():
        raise InvalidInput({"name": [f"A volume named {name} already exists."]})
    with transaction.atomic():
        volume = Volume.objects.create(name=name, host_path=host_path, target=target, read_only=read_only,
                                       all_teams=all_teams, description=description)
        volume.teams.set(list(teams))
        audit_volume_change(actor, volume, request, created=True, **volume_summary(volume))
    return volume


def volume_update(*, volume: Volume, actor: AnyUser, request: HttpRequest | None = None,
                  **changes: Any) -> Volume:
    """Change a volume (any of host_path, target, read_only, teams, all_teams, description). Jobs that name it
    get the new definition at their next dispatch."""
    access.require(actor, access.Action.ADMINISTER)
    _clean(changes)
    teams = changes.pop("teams", None)
    with transaction.atomic():
        for field, value in changes.items():
            setattr(volume, field, value)
        volume.save()
        if teams is not None:
            volume.teams.set(list(teams))
        audit_volume_change(actor, volume, request, changed=sorted([*changes, *(["teams"] if teams is not None else [])]),
               **volume_summary(volume))
    return volume


def volume_delete(*, volume: Volume, actor: AnyUser, request: HttpRequest | None = None) -> None:
    access.require(actor, access.Action.ADMINISTER)
    with transaction.atomic():
        audit_volume_change(actor, volume, request, deleted=True, **volume_summary(volume))
        volume.delete()


def _names(names: object) -> list[str]:
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise InvalidInput({"mounts": ["Give a list of volume names."]})
    return list(dict.fromkeys(names))


def _usable(team_id: int, names: list[str]) -> list[Volume]:
    found = {v.name: v for v in volumes_usable_by(team_id).filter(name__in=names)}
    missing = [n for n in names if n not in found]
    if missing:
        # One answer for unknown volumes and those the team may not use: a name tells nothing about others' volumes.
        raise InvalidInput({"mounts": [f"No volume named {', '.join(missing)} is open to this team's jobs."]})
    volumes = [found[n] for n in names]
    targets: dict[str, str] = {}
    for volume in volumes:
        if volume.target in targets:
            raise InvalidInput({"mounts": [f"Volumes {targets[volume.target]} and {volume.name} both mount at "
                                           f"{volume.target}; a job mounts one of them."]})
        # One inside another would have its mount point made in the other's folder on the host.
        nested = next((target for target in targets
                       if _under(volume.target, target) or _under(target, volume.target)), None)
        if nested is not None:
            raise InvalidInput({"mounts": [f"Volumes {targets[nested]} ({nested}) and {volume.name} ({volume.target}) "
                                           "mount one inside the other; a job mounts one of them."]})
        targets[volume.target] = volume.name
    return volumes


def validate_mount_names(team_id: int, names: list[str]) -> None:
    """Refuse (InvalidInput naming `mounts`) a name that is no volume the team may use."""
    if names:
        _usable(team_id, _names(names))


def resolve_mounts(team_id: int, names: list[str]) -> list[MountSpec]:
    """The mounts of a job of the team that names these volumes, in the order named (refused as above)."""
    if not names:
        return []
    return [MountSpec(name=v.name, source=v.host_path, target=v.target, read_only=v.read_only)
            for v in _usable(team_id, _names(names))]
