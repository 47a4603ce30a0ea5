"""workers/codepack.py: which files a code snapshot takes (checked against git itself), that it is deterministic
and capped, and that unpacking refuses hostile archives."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from workers.codepack import (
    CodePackError,
    CodeTooLarge,
    UnsafeArchive,
    file_sha256,
    pack,
    unpack,
)

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git compares the ignore rules")


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


TREE: dict[str, str | bytes] = {
    ".gitignore": "*.log\n!keep.log\nbuild/\n/top-only.txt\n__pycache__/\ndata/**/raw\n*.ckpt\n",
    "train.py": "print('train')\n",
    "keep.log": "kept\n",
    "noise.log": "ignored\n",
    "top-only.txt": "ignored at the root only\n",
    "build/out.bin": b"\0" * 10,
    "pkg/__init__.py": "",
    "pkg/top-only.txt": "kept: the pattern is anchored to the root\n",
    "pkg/__pycache__/x.pyc": b"\0",
    "pkg/build": "a file named build: build/ matches folders only\n",
    "pkg/.gitignore": "*.csv\n!important.csv\nlocal/\n",
    "pkg/a.csv": "x\n",
    "pkg/important.csv": "y\n",
    "pkg/local/x.py": "",
    "pkg/sub/deep.log": "ignored by the root's *.log\n",
    "pkg/sub/model.ckpt": b"\1" * 10,
    "data/small/raw/a.bin": b"\2",
    "data/small/readme.md": "kept\n",
    "docs/a b (c).md": "odd names\n",
    "docs/ünïcode.md": "non-ASCII names\n",
    "run.sh": "#!/bin/sh\necho hi\n",
    ".env.example": "A=1\n",
}


def git_files(root: Path) -> set[str]:
    """What git would add: tracked nothing yet, so every file not ignored."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    listed = subprocess.run(["git", "-C", str(root), "-c", "core.quotePath=false", "ls-files", "--others",
                             "--exclude-standard", "-z"], capture_output=True, text=True, check=True).stdout
    shutil.rmtree(root / ".git")
    return {name for name in listed.split("\0") if name}


def packed_files(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: m for m in tar.getmembers() if not m.isdir()}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    write(root, TREE)
    (root / "run.sh").chmod(0o755)
    return root


def test_the_files_taken_are_the_ones_git_would_take(tree):
    expected = git_files(tree)
    (tree / ".git").mkdir()
    write(tree, {".git/config": "[core]\n", ".git/objects/ab": b"\0"})
    with pack(tree) as packed:
        names = set(packed_files(packed.path))
        assert names == expected
        assert packed.files == len(expected)
        assert packed.warnings == []
    assert "pkg/important.csv" in names and "pkg/a.csv" not in names and "keep.log" in names
    assert not any(name.startswith(".git/") for name in names)


def test_consoleignore_adds_patterns_and_may_bring_back_what_git_ignores(tree):
    write(tree, {".consoleignore": "docs/\n!noise.log\n", "pkg/.consoleignore": "important.csv\n"})
    with pack(tree) as packed:
        names = set(packed_files(packed.path))
    assert not any(name.startswith("docs/") for name in names)
    assert "noise.log" in names  # negated in .consoleignore, read after .gitignore
    assert "pkg/important.csv" not in names
    assert ".consoleignore" in names  # like .gitignore, it travels with the code


def test_the_same_tree_gives_the_same_archive_wherever_and_whenever_it_lies(tree, tmp_path):
    with pack(tree) as first:
        copy = tmp_path / "elsewhere" / "copy"
        shutil.copytree(tree, copy, symlinks=True)
        os.utime(copy / "train.py", (1, 1))
        with pack(copy) as second:
            assert (first.sha256, first.size) == (second.sha256, second.size)
            assert first.sha256 == file_sha256(first.path)
        members = packed_files(first.path)
    for member in members.values():
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", "")
    assert members["run.sh"].mode == 0o755 and members["train.py"].mode == 0o644
    (tree / "train.py").write_text("print('changed')\n")
    with pack(tree) as changed:
        assert changed.sha256 != first.sha256


def test_links_inside_are_kept_relative_and_links_out_are_left_out_with_a_warning(tree, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("not for upload\n")
    (tree / "latest.py").symlink_to("train.py")
    (tree / "pkg" / "abs-inside.py").symlink_to(tree / "train.py")
    (tree / "pkg" / "alias").symlink_to("../data")  # a folder: kept as a link, not followed
    (tree / "escape.txt").symlink_to(outside)
    (tree / "pkg" / "up").symlink_to("../../secret.txt")
    (tree / "chain").symlink_to("pkg/up")  # inside by name, outside once resolved
    with pack(tree) as packed:
        members = packed_files(packed.path)
        warnings = packed.warnings
    assert members["latest.py"].issym() and members["latest.py"].linkname == "train.py"
    assert members["pkg/abs-inside.py"].linkname == "../train.py"
    assert members["pkg/alias"].issym() and not any(name.startswith("pkg/alias/") for name in members)
    for name in ("escape.txt", "pkg/up", "chain"):
        assert name not in members
        assert any(w.startswith(f"{name}: a symbolic link") for w in warnings)


def test_past_the_caps_the_error_names_the_biggest_folders_and_files(tree):
    write(tree, {"data/big/weights.bin": os.urandom(300_000), "data/big/other.bin": os.urandom(100_000),
                 "notes.bin": b"\5" * 50_000, "text/repetitive.txt": "the same line\n" * 20_000})
    # The archive's cap: random bytes do not compress, so packing stops once past it.
    with pytest.raises(CodeTooLarge) as caught:
        pack(tree, max_bytes=200_000)
    message = str(caught.value)
    assert "over the cap of 195.3 KiB compressed (" in message and ".consoleignore" in message
    assert "largest folders: data/ 390.6 KiB, text/ 273.4 KiB" in message
    assert "largest files: data/big/weights.bin 293.0 KiB, text/repetitive.txt 273.4 KiB" in message
    # The unpacked cap and the entries' cap are checked before anything is compressed.
    with pytest.raises(CodeTooLarge, match=r"holds 7\d\d.\d KiB, over the cap of 488.3 KiB"):
        pack(tree, max_unpacked_bytes=500_000)
    with pytest.raises(CodeTooLarge, match="entries, over the cap of 5"):
        pack(tree, max_files=5)
    # Ignored files do not count; text that compresses well fits under an archive cap smaller than itself.
    write(tree, {".consoleignore": "data/big/\nnotes.bin\n"})
    with pack(tree, max_bytes=200_000) as packed:
        assert packed.size < 200_000 < packed.content_bytes


def test_unreadable_files_and_missing_folders_are_clear_errors(tree):
    with pytest.raises(CodePackError, match="is not a directory"):
        pack(tree / "missing")
    if os.geteuid() != 0:  # root reads anything
        (tree / "train.py").chmod(0)
        with pytest.raises(CodePackError, match="cannot read train.py"):
            pack(tree)


# --- unpacking


def test_unpack_gives_back_the_tree(tree, tmp_path):
    (tree / "latest.py").symlink_to("train.py")
    with pack(tree) as packed:
        unpack(packed.path, tmp_path / "out")
        expected = packed_files(packed.path)
    out = tmp_path / "out"
    assert (out / "train.py").read_text() == TREE["train.py"]
    assert (out / "docs" / "ünïcode.md").exists()
    assert os.readlink(out / "latest.py") == "train.py"
    assert os.access(out / "run.sh", os.X_OK)
    got = {p.relative_to(out).as_posix() for p in out.rglob("*") if not p.is_dir() or p.is_symlink()}
    assert got == set(expected)


def hostile(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    path = tmp_path / "hostile.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def info(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.size, member.linkname = kind, size, linkname
    return member


@pytest.mark.parametrize(("members", "message"), [
    ([(info("../evil.py", size=1), b"x")], "outside"),
    ([(info("/etc/evil", size=1), b"x")], "absolute"),
    ([(info("link", tarfile.SYMTYPE, linkname="/etc/passwd"), None)], "absolute"),
    ([(info("link", tarfile.SYMTYPE, linkname="../../outside"), None)], "outside"),
    ([(info("a", size=1), b"x"), (info("hard", tarfile.LNKTYPE, linkname="a"), None)], "files, folders and links"),
    ([(info("dev", tarfile.CHRTYPE), None)], "files, folders and links"),
    ([(info("fifo", tarfile.FIFOTYPE), None)], "files, folders and links"),
])
def test_unpack_refuses_what_would_escape_or_is_no_plain_file(tmp_path, members, message):
    archive = hostile(tmp_path, *members)
    with pytest.raises(UnsafeArchive, match=message):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "outside").exists()


def test_unpack_bounds_the_unpacked_size_and_the_entries(tmp_path):
    bomb = hostile(tmp_path, (info("zeros.bin", size=5_000_000), b"\0" * 5_000_000))
    assert bomb.stat().st_size < 100_000  # small on the wire, big on the disk
    with pytest.raises(UnsafeArchive, match="unpacks to more than"):
        unpack(bomb, tmp_path / "out", max_unpacked_bytes=1_000_000)
    assert not (tmp_path / "out" / "zeros.bin").exists()
    many = hostile(tmp_path, *[(info(f"f{i}"), b"") for i in range(20)])
    with pytest.raises(UnsafeArchive, match="more than 10 entries"):
        unpack(many, tmp_path / "out2", max_files=10)
    with pytest.raises(UnsafeArchive, match="over the cap"):
        unpack(many, tmp_path / "out3", max_bytes=100)


def test_unpack_refuses_what_is_not_a_tar_gz(tmp_path):
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"this is no archive" * 10)
    with pytest.raises(CodePackError, match="not a readable tar.gz"):
        unpack(garbage, tmp_path / "out")


NAMES = ["a", "b", "build", "x.log", "keep.log", "data", "c.py"]
PATTERNS = ["*.log", "!keep.log", "build/", "build", "/a", "a/", "data/**", "!data/c.py", "**/b", "b/*", "a/**/c.py",
            "*.py", "!*.py", "/data/", "x.*", "d*", "!b", "?.py", "[ab]", "a/b", "**/data/c.py"]


@pytest.mark.parametrize("seed", range(40))
def test_random_trees_and_ignore_files_agree_with_git(tmp_path, seed):
    """Random trees with random .gitignore files at random depths: the files packed are git's, every time (150
    seeds agreed when this was written; 40 run here)."""
    import random

    rnd = random.Random(seed)
    root = tmp_path / "tree"
    made: list[str] = []
    for rel in sorted({"/".join(rnd.choice(NAMES) for _ in range(rnd.randint(1, 3))) for _ in range(12)},
                      key=len, reverse=True):
        path = root / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_text("x")
                made.append(rel)
        except (FileExistsError, NotADirectoryError):  # a name already taken by a file or a folder
            pass
    folders = ["."] + sorted({str(Path(rel).parent) for rel in made if "/" in rel})
    for folder in rnd.sample(folders, k=min(len(folders), rnd.randint(1, 3))):
        (root / folder / ".gitignore").write_text("\n".join(rnd.sample(PATTERNS, k=rnd.randint(1, 4))) + "\n")
    expected = git_files(root)
    with pack(root) as packed:
        assert set(packed_files(packed.path)) == expected
