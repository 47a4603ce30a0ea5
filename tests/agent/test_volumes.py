"""Where a job's volume comes from (workers/agent/volumes.py), checked alike for containers and process jobs."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from workers.agent.volumes import VolumeError, resolve
from workers.protocol import MountSpec

JOB_UID = 3_940_000


def no_job_user(uid: int) -> bool:
    return False


def test_a_source_below_a_volume_root_resolves_with_its_links_followed(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "imagenet").mkdir(parents=True)
    (root / "latest").symlink_to(root / "imagenet")
    bind = resolve(MountSpec("imagenet", str(root / "latest"), "/mnt/imagenet/"), (root,), no_job_user)
    assert (bind.source, bind.target, bind.read_only) == (root / "imagenet", PurePosixPath("/mnt/imagenet"), True)
    assert resolve(MountSpec("all", str(root), "/mnt/all"), (root,), no_job_user).source == root


@pytest.mark.parametrize(("source", "target", "why"), [
    ("/etc", "/mnt/etc", "outside this host's volume roots"),
    ("{root}/../elsewhere", "/mnt/x", "outside this host's volume roots"),
    ("{root}/missing", "/mnt/x", "does not exist on this host"),
    ("{root}/imagenet", "/usr/share/x", "target /usr/share/x is not allowed"),
    ("{root}/imagenet", "/", "target / is not allowed"),
    ("{root}/imagenet", "/workspace/code", "is not allowed"),
])
def test_a_mount_this_host_will_not_give_fails_saying_why(tmp_path: Path, source: str, target: str, why: str):
    root = tmp_path / "data"
    (root / "imagenet").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(VolumeError, match=why):
        resolve(MountSpec("v", source.format(root=root), target), (root,), no_job_user)


def test_a_source_a_job_could_swap_for_a_link_is_refused(tmp_path: Path) -> None:
    """A folder on the way from the volume root that jobs may write in (a writable scratch volume holding another
    volume's data, say) would let a job swap the source for a link before it is bound."""
    root = tmp_path / "data"
    shared = root / "scratch"
    (shared / "imagenet").mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(VolumeError, match=f"jobs could write in {shared}, on the way to"):
        resolve(MountSpec("imagenet", str(shared / "imagenet"), "/mnt/imagenet"), (root,), no_job_user)
    shared.chmod(0o755)
    assert resolve(MountSpec("imagenet", str(shared / "imagenet"), "/mnt/imagenet"), (root,), no_job_user)
    # The source itself may be writable by jobs (a writable volume): only the folders above it matter.
    (shared / "imagenet").chmod(0o777)
    assert resolve(MountSpec("imagenet", str(shared / "imagenet"), "/mnt/imagenet"), (root,), no_job_user)
    if os.geteuid() == 0:
        os.chown(shared, JOB_UID, JOB_UID)
        with pytest.raises(VolumeError, match="jobs could write in"):
            resolve(MountSpec("imagenet", str(shared / "imagenet"), "/mnt/imagenet"), (root,),
                    lambda uid: uid == JOB_UID)
