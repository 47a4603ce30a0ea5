"""Code snapshots: a directory packed into a deterministic tar.gz (what `gpuctl submit --code DIR` uploads), and
the safe extraction of one (what the agent does before a job starts in it).

Packing honours `.gitignore` and `.consoleignore` files (the root's and nested ones, git's matching rules; in a
folder, `.consoleignore` is read after `.gitignore`, so its `!pattern` lines can bring back what git ignores) and
always leaves out `.git`. The same tree gives the same bytes, hence the same digest: entries are sorted, times,
owners and modes normalised. A symbolic link is kept when it points inside the tree, and left out with a warning
otherwise. Pure Python (no Django): the CLI and the agent both use it.
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import os
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal

import pathspec

from workers.protocol import CODE_SNAPSHOT_MAX_BYTES

IGNORE_FILES = (".gitignore", ".consoleignore")
ALWAYS_LEFT_OUT = frozenset({".git"})
# The archive itself is capped at workers.protocol.CODE_SNAPSHOT_MAX_BYTES. Unpacked, a snapshot holds at most
# this much and this many entries (files, folders, links): a gzip bomb, or an archive of a million empty files,
# is refused while it is read. The console checks an upload against the same bounds.
CODE_SNAPSHOT_MAX_UNPACKED_BYTES = 4 * 1024**3
CODE_SNAPSHOT_MAX_FILES = 200_000
COMPRESS_LEVEL = 6  # gzip's own default; 9 is ~3x slower for a few per cent
_CHUNK = 1024 * 1024

EntryKind = Literal["dir", "file", "link"]


class CodePackError(ValueError):
    """A directory that cannot be packed, or an archive that must not be unpacked, with a readable reason."""


class CodeTooLarge(CodePackError):
    def __init__(self, message: str, *, total: int, limit: int) -> None:
        super().__init__(message)
        self.total = total
        self.limit = limit


class UnsafeArchive(CodePackError):
    """An archive that would write outside its folder, holds links out, devices, or more than the caps."""


@dataclass(frozen=True)
class _Entry:
    rel: str  # the path inside the archive, with / separators
    kind: EntryKind
    size: int = 0
    executable: bool = False
    target: str = ""  # a link's target, relative to the link's folder


@dataclass
class PackedCode:
    """A packed tree: the archive in a temporary file (removed by `discard()` or leaving a `with` block)."""

    path: Path
    sha256: str
    size: int  # bytes of the tar.gz
    files: int  # regular files and links in it
    content_bytes: int  # bytes of the files before compression
    warnings: list[str] = field(default_factory=list)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> PackedCode:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.discard()


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# --- which files go in


class _Ignores:
    """The ignore files met on the way down: the deepest one that has a say about a path decides (git's rule)."""

    def __init__(self, layers: tuple[tuple[str, pathspec.GitIgnoreSpec], ...] = ()) -> None:
        self.layers = layers

    def below(self, folder: Path, rel_folder: str) -> _Ignores:
        lines: list[str] = []
        for name in IGNORE_FILES:
            try:
                lines += (folder / name).read_text(encoding="utf-8", errors="replace").splitlines()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except OSError as exc:
                raise CodePackError(f"cannot read {rel_folder}{name}: {exc.strerror}") from None
        if not lines:
            return self
        return _Ignores((*self.layers, (rel_folder, pathspec.GitIgnoreSpec.from_lines(lines))))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        verdict: bool | None = None
        for base, spec in self.layers:
            result = spec.check_file(rel[len(base):] + ("/" if is_dir else ""))
            if result.include is not None:
                verdict = result.include
        return bool(verdict)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _collect(root: Path) -> tuple[list[_Entry], list[str]]:
    """The entries to pack, sorted, and warnings about what was left out against the user's likely wish."""
    entries: list[_Entry] = []
    warnings: list[str] = []
    real_root = os.path.realpath(root)

    def walk(folder: Path, rel_folder: str, ignores: _Ignores) -> None:
        ignores = ignores.below(folder, rel_folder)
        try:
            with os.scandir(folder) as scan:
                items = sorted(scan, key=lambda item: item.name)
        except OSError as exc:
            raise CodePackError(f"cannot list {rel_folder or './'}: {exc.strerror}") from None
        for item in items:
            if item.name in ALWAYS_LEFT_OUT:
                continue
            rel = rel_folder + item.name
            is_dir = item.is_dir(follow_symlinks=False)
            if ignores.ignored(rel, is_dir):
                continue
            if item.is_symlink():
                entry = _link(item, folder, rel, real_root)
                if entry is None:
                    warnings.append(f"{rel}: a symbolic link to {os.readlink(item.path)}, outside the directory: "
                                    "left out")
                else:
                    entries.append(entry)
            elif is_dir:
                entries.append(_Entry(rel, "dir"))
                walk(Path(item.path), rel + "/", ignores)
            elif item.is_file(follow_symlinks=False):
                info = item.stat(follow_symlinks=False)
                entries.append(_Entry(rel, "file", info.st_size, bool(info.st_mode & stat.S_IXUSR)))
            else:
                warnings.append(f"{rel}: not a regular file, folder or link: left out")

    walk(Path(real_root), "", _Ignores())
    return entries, warnings


def _link(item: os.DirEntry[str], folder: Path, rel: str, real_root: str) -> _Entry | None:
    """A link kept as a relative one, when both its written target and what it resolves to lie in the tree."""
    target = os.readlink(item.path)
    lexical = os.path.normpath(os.path.join(folder, target))
    if not (_inside(lexical, real_root) and _inside(os.path.realpath(item.path), real_root)):
        return None
    return _Entry(rel, "link", target=os.path.relpath(lexical, folder))


def _biggest(entries: list[_Entry], count: int = 5) -> str:
    """The largest files and top-level folders, the ones to name in a .consoleignore."""
    tops: dict[str, int] = {}
    for entry in entries:
        if entry.kind == "file" and "/" in entry.rel:
            top = entry.rel.split("/", 1)[0] + "/"
            tops[top] = tops.get(top, 0) + entry.size
    files = heapq.nlargest(count, (e for e in entries if e.kind == "file"), key=lambda e: e.size)
    folders = heapq.nlargest(count, tops.items(), key=lambda item: item[1])
    lines = []
    if folders:
        lines.append("largest folders: " + ", ".join(f"{name} {human_size(size)}" for name, size in folders))
    if files:
        lines.append("largest files: " + ", ".join(f"{e.rel} {human_size(e.size)}" for e in files))
    return "\n".join(lines)


_HINT = "leave out what is not code with a .consoleignore (same syntax as .gitignore) in the folder, or put data in a mount"


def _too_large(what: str, entries: list[_Entry], *, total: int, limit: int) -> CodeTooLarge:
    return CodeTooLarge(f"{what}; {_HINT}.\n{_biggest(entries)}", total=total, limit=limit)


def _check_caps(entries: list[_Entry], max_unpacked_bytes: int, max_files: int) -> int:
    content = sum(entry.size for entry in entries)
    if content > max_unpacked_bytes:
        raise _too_large(f"the code to upload holds {human_size(content)}, over the cap of "
                         f"{human_size(max_unpacked_bytes)}", entries, total=content, limit=max_unpacked_bytes)
    if len(entries) > max_files:
        folders: dict[str, int] = {}
        for entry in entries:
            top = entry.rel.split("/", 1)[0] + ("/" if "/" in entry.rel else "")
            folders[top] = folders.get(top, 0) + 1
        crowded = heapq.nlargest(5, folders.items(), key=lambda item: item[1])
        raise CodeTooLarge(
            f"the code to upload holds {len(entries)} entries, over the cap of {max_files}; {_HINT}.\n"
            "most entries: " + ", ".join(f"{name} {number}" for name, number in crowded),
            total=len(entries), limit=max_files)
    return content


# --- packing


class _CountingWriter:
    """A file's write end that hashes and counts what passes, and stops past `limit` bytes."""

    def __init__(self, raw: BinaryIO, limit: int, entries: list[_Entry], content: int) -> None:
        self.raw = raw
        self.limit = limit
        self.size = 0
        self.digest = hashlib.sha256()
        self.entries = entries
        self.content = content

    def write(self, data: bytes) -> int:
        if self.size > self.limit:  # already refused: the gzip stream's closing writes go nowhere
            return len(data)
        self.size += len(data)
        if self.size > self.limit:  # stop at once: no point compressing the rest
            raise _too_large(f"the code to upload is over the cap of {human_size(self.limit)} compressed "
                             f"({human_size(self.content)} of files)", self.entries, total=self.size,
                             limit=self.limit)
        self.digest.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _tarinfo(entry: _Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.rel)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if entry.kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif entry.kind == "link":
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, entry.target
    else:
        info.mode = 0o755 if entry.executable else 0o644
    return info


def pack(directory: Path, *, max_bytes: int = CODE_SNAPSHOT_MAX_BYTES,
         max_unpacked_bytes: int = CODE_SNAPSHOT_MAX_UNPACKED_BYTES,
         max_files: int = CODE_SNAPSHOT_MAX_FILES) -> PackedCode:
    """`directory` as a tar.gz in a temporary file. Raises CodeTooLarge past the caps (`max_bytes` on the archive,
    the others on what it unpacks to: what `unpack` accepts), naming the largest folders and files;
    CodePackError when a file cannot be read."""
    root = Path(directory)
    if not root.is_dir():
        raise CodePackError(f"{directory} is not a directory")
    entries, warnings = _collect(root)
    expected = _check_caps(entries, max_unpacked_bytes, max_files)
    fd, name = tempfile.mkstemp(prefix="code-snapshot-", suffix=".tar.gz")
    path = Path(name)
    content = files = 0
    real_root = Path(os.path.realpath(root))
    try:
        with os.fdopen(fd, "wb") as raw:
            sink = _CountingWriter(raw, max_bytes, entries, expected)
            with gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0,
                               compresslevel=COMPRESS_LEVEL) as compressed, \
                    tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for entry in entries:
                    info = _tarinfo(entry)
                    if entry.kind != "file":
                        tar.addfile(info)
                        files += entry.kind == "link"
                        continue
                    try:
                        with open(real_root / entry.rel, "rb") as source:
                            info.size = os.fstat(source.fileno()).st_size
                            content += info.size
                            if content > max_unpacked_bytes:
                                raise CodeTooLarge(f"the code grew past the cap of {human_size(max_unpacked_bytes)} "
                                                   "while being packed", total=content, limit=max_unpacked_bytes)
                            tar.addfile(info, source)
                    except OSError as exc:
                        raise CodePackError(f"cannot read {entry.rel}: {exc.strerror or exc}; leave it out with a "
                                            ".consoleignore") from None
                    files += 1
        return PackedCode(path, sink.digest.hexdigest(), sink.size, files, content, warnings)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- unpacking


def _checked_members(tar: tarfile.TarFile, max_unpacked_bytes: int, max_files: int) -> Iterator[tarfile.TarInfo]:
    """The archive's members, refusing types a code snapshot never holds and stopping at the caps before
    anything past them is written."""
    total = 0
    for count, member in enumerate(tar, start=1):
        if count > max_files:
            raise UnsafeArchive(f"the archive holds more than {max_files} entries")
        if member.name.startswith("/"):  # the data filter would strip the slash; no archive of ours has one
            raise UnsafeArchive(f"{member.name}: an absolute path")
        if not (member.isreg() or member.isdir() or member.issym()):
            raise UnsafeArchive(f"{member.name}: a code snapshot holds files, folders and links only")
        total += member.size
        if total > max_unpacked_bytes:
            raise UnsafeArchive(f"the archive unpacks to more than {human_size(max_unpacked_bytes)}")
        yield member


def unpack(archive: Path, dest: Path, max_bytes: int = CODE_SNAPSHOT_MAX_BYTES, *,
           max_unpacked_bytes: int = CODE_SNAPSHOT_MAX_UNPACKED_BYTES,
           max_files: int = CODE_SNAPSHOT_MAX_FILES) -> None:
    """Extract a code snapshot into `dest` (created if missing). tarfile's "data" filter refuses absolute
    paths, `..`, links that leave `dest` and special files, and drops owners and odd mode bits. `max_bytes` bounds
    the archive file, `max_unpacked_bytes` and `max_files` what it unpacks to (checked as each entry is read,
    before it is written). Raises UnsafeArchive, or CodePackError for an archive that is not a tar.gz (both are
    ValueErrors); `dest` may then hold part of it."""
    size = Path(archive).stat().st_size
    if size > max_bytes:
        raise UnsafeArchive(f"the archive is {human_size(size)}, over the cap of {human_size(max_bytes)}")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            tar.errorlevel = 2
            tar.extractall(dest, members=_checked_members(tar, max_unpacked_bytes, max_files), filter="data")
    except tarfile.FilterError as exc:
        raise UnsafeArchive(f"refused to unpack: {exc}") from None
    except (tarfile.ReadError, tarfile.CompressionError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise CodePackError(f"not a readable tar.gz: {exc}") from None
