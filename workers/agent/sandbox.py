"""What a job sees of the host's files: a private mount namespace, built by the shim before the job starts.

The agent decides the view (`FilesystemView`): folders to cover with an empty tmpfs (the agent's and the console's
state, folders the job's user could not traverse), files to cover with /dev/null (the host token, other GPUs'
device nodes), and the paths the job needs put back at the same place (its own work folder and artifact folders
writable; the Python environment and the code read-only). It also gets a private /tmp and /dev/shm, and a /proc
that shows it only its own processes. The shim applies the view in the job's first process, as root, just before
it drops to the job's user: nothing the job starts can leave the namespace or undo it without privileges.

The admin's volumes a job names are bound at their targets (`binds`): the folder holding a target is covered like
a hidden one (a job under /mnt sees its own volumes there, not the host's other mounts), so the mount point is made
in that tmpfs, never on the host; a target right under / must exist on the host. Each is bound without the mounts
below its source (a read-only bind stays read-only all the way down) and with nosuid and nodev.

Paths keep their names, so a job's argv, the virtual environment's interpreter and the editable install of the
runtime work unchanged; covering a folder the job cannot traverse and putting back only what it needs is how a job
reaches its code in a checkout under a private (0700) folder without that folder being opened to anyone.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
# Shared by every job's view: what the job may not see or must see privately.
PRIVATE_TMP = ("/tmp", "/dev/shm")


class SandboxError(OSError):
    """The view could not be built: the job must not start without it."""


class ViewError(ValueError):
    """A view the agent will not plan (a volume's target in the way of what the job needs); the job's reason."""


@dataclass(frozen=True)
class FilesystemView:
    hide: tuple[str, ...] = ()  # folders covered by an empty, read-only-for-the-job tmpfs
    mask: tuple[str, ...] = ()  # files covered by /dev/null
    writable: tuple[str, ...] = ()  # put back read-write at the same path
    readable: tuple[str, ...] = ()  # put back read-only at the same path
    private_tmp: tuple[str, ...] = PRIVATE_TMP  # a fresh world-writable (sticky) tmpfs each
    own_processes_only: bool = True  # /proc with hidepid=invisible
    binds: tuple[tuple[str, str, bool], ...] = ()  # (source, target, read-only): the volumes the job names
    listable: tuple[str, ...] = ()  # covered folders the job may list: where its volumes' mount points are

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FilesystemView:
        data = json.loads(text)
        binds = tuple((str(source), str(target), bool(read_only)) for source, target, read_only in data.pop("binds", []))
        fields = {name: tuple(value) if isinstance(value, list) else value for name, value in data.items()}
        return cls(**fields, binds=binds)


def plan_view(*, writable: Iterable[Path], readable: Iterable[Path], private: Iterable[Path],
              mask: Iterable[Path], can_search: Callable[[Path], bool],
              binds: Iterable[tuple[Path, PurePosixPath, bool]] = (),
              runs_jobs_as: Callable[[int], bool] = lambda uid: False) -> FilesystemView:
    """The view of a job that needs `writable` and `readable`, must not see `private` (folders) nor `mask` (files).

    `can_search(folder)` says whether the job's user may traverse `folder`. A folder on the way to what the job
    needs that the job would meet with its own permissions and could not traverse is covered too, and what the
    job needs below it is put back, so the job reaches exactly what it needs. This holds below what is put back
    as well: a code root put back read-only brings back its own private folders (a checkout's `var/`), which are
    covered again, and a work folder inside one of them is put back inside that cover.

    `binds` (source, target, read-only): volumes, bound at their targets; ViewError if one is in the way, or if a
    job (a user `runs_jobs_as`) could swap a folder on the way to where its mount point is made.
    """
    writable = [_real(p) for p in writable if p.exists()]
    readable = [_real(p) for p in readable if p.exists()]
    needed = {*writable, *readable}
    hide = {_real(p) for p in private if p.exists() and p.is_dir()}
    tmp = {Path(p) for p in PRIVATE_TMP}
    placed = [(source, *_bind_target(source, Path(target), [*needed, *hide, *tmp], runs_jobs_as), read_only)
              for source, target, read_only in binds]
    for index, (_, target, _, _) in enumerate(placed):
        for _, other, _, _ in placed[index + 1:]:
            if target == other or target in other.parents or other in target.parents:
                raise ViewError(f"targets {target} and {other}: one inside the other (the inner one's mount point "
                                "would be made in the outer volume's folder on the host)")
    listable = {cover for _, _, cover, _ in placed if cover is not None}
    hide |= listable

    def nearest_above(folder: Path) -> Path | None:
        """The deepest covered or put-back folder strictly above `folder`: what decides what the job meets there."""
        above = [p for p in (*hide, *tmp, *needed) if p != folder and folder.is_relative_to(p)]
        return max(above, key=lambda p: (len(p.parts), p in needed), default=None)

    def met_as_is(folder: Path) -> bool:
        """Whether the job meets `folder` itself, with its own owner and mode (not a mount point in a tmpfs)."""
        if folder in needed:
            return True
        if folder in hide or folder in tmp:
            return False
        top = nearest_above(folder)
        return top is None or top in needed

    changed = True
    while changed:  # each pass covers one more folder at most per needed path; the set only grows
        changed = False
        for path in sorted(needed):
            for folder in reversed(path.parents):  # from / down to the path's parent
                if folder not in needed and folder not in hide and met_as_is(folder) and not can_search(folder):
                    hide.add(folder)
                    changed = True
                    break
    # A covered folder the job cannot meet anyway (under another cover, nothing put back in between) is left out:
    # its mount point would not exist in the view.
    hide = {p for p in hide if (top := nearest_above(p)) is None or top in needed}
    # What the job reads is bound read-only wherever it is, not only below a cover: the agent's Python and code
    # are what its shim runs as root, and a job must not write them even where the host's permissions would let it
    # (a virtual environment owned by the --run-as user, a group-writable install). A writable folder inside one is
    # put back after it.
    covered = [*hide, *tmp, *readable]

    def needs_putting_back(path: Path) -> bool:
        return any(path != top and path.is_relative_to(top) for top in covered)

    return FilesystemView(
        hide=tuple(sorted(map(str, hide))),
        mask=tuple(sorted({str(_real(p)) for p in mask if p.exists() and not p.is_dir()})),
        writable=tuple(sorted({str(p) for p in writable if needs_putting_back(p)})),
        readable=tuple(sorted({str(p) for p in readable})),
        binds=tuple((str(source), str(target), read_only) for source, target, _, read_only in placed),
        listable=tuple(sorted(str(p) for p in listable if p in hide)),
    )


def swap_point(path: Path, runs_jobs_as: Callable[[int], bool]) -> Path | None:
    """The first folder on the way to `path` (itself included) that a job could rename or replace with a link: one
    in a folder jobs may write in (group- or world-writable, or a job user's), unless that folder is sticky and
    neither it nor the entry is a job user's. None if there is none."""
    for folder in [*reversed(path.parents[:-1]), path]:  # from below / down to `path`
        holder, entry = folder.parent.lstat(), folder.lstat()
        writable = holder.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or runs_jobs_as(holder.st_uid)
        sticky = holder.st_mode & stat.S_ISVTX and not runs_jobs_as(holder.st_uid)
        if writable and not (sticky and not runs_jobs_as(entry.st_uid)):
            return folder
    return None


def _bind_target(source: Path, target: Path, laid_out: list[Path],
                 runs_jobs_as: Callable[[int], bool]) -> tuple[Path, Path | None]:
    """Where a volume lands in the view (`target`, the links of the host folders above it resolved), and the host
    folder covered to make its mount point in (the deepest that exists above it; None right under /, where the
    target must be a folder of the host's and the source a folder). It may neither be nor hold nor sit in what the
    view lays out."""
    folder = target.parent
    while not folder.exists() and folder != Path("/"):
        folder = folder.parent
    if folder == Path("/") and target.parent != Path("/"):
        raise ViewError(f"target {target}: its folder {target.parent} does not exist on this host")
    if not folder.is_dir():
        raise ViewError(f"target {target}: {folder} on the host is no folder")
    cover: Path | None = _real(folder)
    swappable = swap_point(_real(folder), runs_jobs_as)
    if swappable is not None:  # the mount point is made below it by path: a link swapped in would redirect it
        raise ViewError(f"target {target}: jobs could write in the folder holding {swappable}")
    placed = _real(folder) / target.relative_to(folder)
    if cover == Path("/"):
        placed = _real(placed)
        if not placed.is_dir() or not source.is_dir():
            raise ViewError(f"target {target}: right under /, it must be a folder on this host, and the volume one")
        cover = None
    for path in laid_out:
        if path == placed or placed in path.parents or path in placed.parents:
            raise ViewError(f"target {target}: in the way of {path}, which the agent lays out for the job")
    return placed, cover


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


# --- applying a view (in the job's first process, as root, before it drops privileges)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    encode = lambda value: None if value is None else value.encode()  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        code = ctypes.get_errno()
        raise SandboxError(code, f"mount {fstype or 'bind'} {source or ''} on {target}: {os.strerror(code)}")


def _ensure_mount_point(path: Path, *, is_dir: bool) -> None:
    """Create a missing mount point (inside a tmpfs this view mounted; never follows links)."""
    if os.path.lexists(path):
        return
    _ensure_mount_point(path.parent, is_dir=True)
    if is_dir:
        os.mkdir(path, 0o711)
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def enter(view: FilesystemView) -> None:
    """Give this process a private mount namespace laid out as `view` says. Raises SandboxError on any failure."""
    if _libc().unshare(CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise SandboxError(code, f"unshare(CLONE_NEWNS): {os.strerror(code)}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here shows outside
    # Open what is put back before anything covers it (a covered path can no longer be reached by name), and
    # only now: a bind mount's source must be a mount of this namespace.
    sources = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in (*view.writable, *view.readable)}
    volumes: dict[str, tuple[int, bool]] = {}
    try:
        for volume_source, volume_target, read_only in view.binds:
            fd = os.open(volume_source, os.O_PATH | os.O_CLOEXEC)
            volumes[volume_target] = (fd, read_only)
            # The agent resolved the source's links when it checked it against its volume roots; a folder on the
            # way swapped for a link since (by a job with another volume writable there) must not redirect it.
            if os.readlink(f"/proc/self/fd/{fd}") != volume_source:
                raise SandboxError(errno.EXDEV, f"volume source {volume_source} changed since the agent checked it")
        steps: list[tuple[int, int, str, str]] = []  # (depth, order, kind, path): parents before children
        for kind, paths in (("hide", view.hide), ("tmp", view.private_tmp), ("writable", view.writable),
                            ("readable", view.readable), ("mask", view.mask), ("volume", tuple(volumes))):
            for path in paths:
                steps.append((len(Path(path).parts), 0 if kind in ("hide", "tmp") else 1, kind, path))
        for _, _, kind, path in sorted(steps):
            target = Path(path)
            if kind == "hide":
                mode = "0755" if path in view.listable else "0711"  # (`ls /mnt` shows the job its volumes)
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size=1m,nr_inodes=4096")
            elif kind == "tmp":
                if target.is_dir():
                    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
            elif kind == "mask":
                if os.path.lexists(target):
                    _mount("/dev/null", path, None, MS_BIND)
            elif kind == "volume":
                fd, volume_read_only = volumes[path]
                _ensure_mount_point(target, is_dir=stat.S_ISDIR(os.fstat(fd).st_mode))
                _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)  # not MS_REC: read-only holds throughout
                flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_RDONLY if volume_read_only else 0)
                if os.fstatvfs(fd).f_flag & os.ST_NOEXEC:  # (the remount sets every flag: keep the source's)
                    flags |= MS_NOEXEC
                _mount(None, path, None, flags)
            else:
                source = sources[path]
                _ensure_mount_point(target, is_dir=stat.S_ISDIR(os.fstat(source).st_mode))
                _mount(f"/proc/self/fd/{source}", path, None, MS_BIND | MS_REC)
                if kind == "readable":
                    _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
        if view.own_processes_only:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    finally:
        for fd in [*sources.values(), *(fd for fd, _ in volumes.values())]:
            os.close(fd)


def views_unavailable() -> str | None:
    """Why this process cannot build job views (no CAP_SYS_ADMIN: a container without it), or None if it can.
    Tried in a throw-away child, so the agent's own mounts stay as they are."""
    pid = os.fork()
    if pid == 0:
        try:
            if _libc().unshare(CLONE_NEWNS) != 0:
                os._exit(ctypes.get_errno() or 1)
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k")
        except OSError as exc:
            os._exit(exc.errno or 1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return None if code == 0 else f"a private mount namespace cannot be made here ({os.strerror(code)})"
