"""The admin's volumes in a job without an image: bound in the job's view, only on an agent that runs each job under
a uid of its own, and only from below its --volume-root list; any other case fails the job saying why."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.agent.test_end_report import WAIT_S
from tests.agent.test_process_secrets import Console
from workers.agent.runner import JobRunner, JobUids
from workers.protocol import ContainerSpec, Dispatch, MountSpec

JOB_UIDS = (3_930_000, 3_930_009)
READ = "import sys; print('labels:', open(sys.argv[1]).read(), 'uid', __import__('os').getuid())"


def dataset(tmp_path: Path) -> Path:
    folder = tmp_path / "volumes" / "imagenet"
    folder.mkdir(parents=True)
    (folder / "labels.txt").write_text("cat dog")
    folder.chmod(0o755)
    (folder / "labels.txt").chmod(0o644)
    return folder


def run(runner: JobRunner, console: Console, mount: MountSpec, job_id: int,
        read: Path | None = None) -> tuple[str, str, str]:
    target = read or Path(mount.target) / "labels.txt"
    dispatch = Dispatch(job_id=job_id, attempt=1, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": [sys.executable, "-c", READ, str(target)]}, time_limit_s=60,
                        container=ContainerSpec(mounts=(mount,)))
    assert runner.start(dispatch) == "started"
    assert console.ended.wait(WAIT_S)
    console.ended.clear()
    final = console.statuses[-1]
    return final.state, final.reason, "".join(console.logs)


def test_an_agent_without_job_uids_binds_no_volume_into_a_process_job(tmp_path: Path) -> None:
    console = Console()
    runner = JobRunner(console, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True, volume_roots=(tmp_path / "volumes",))
    mount = MountSpec("imagenet", str(dataset(tmp_path)), f"/mnt/console-{os.getpid()}/imagenet")
    state, reason, log = run(runner, console, mount, 1)
    assert state == "failed" and "does not run each job under a uid of its own" in reason
    assert "cat dog" not in log  # (its command line, logged, names the file)


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs under uids of their own need root")
def test_a_process_job_reads_its_volume_at_its_target_and_nothing_from_outside_the_volume_roots(tmp_path: Path):
    console = Console()
    runner = JobRunner(console, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       simulated=True, job_uids=JobUids(*JOB_UIDS), volume_roots=(tmp_path / "volumes",))
    source = dataset(tmp_path)
    target = f"/mnt/console-{os.getpid()}/imagenet"
    state, reason, log = run(runner, console, MountSpec("imagenet", str(source), target), 2)
    assert state == "succeeded", (reason, log)
    assert f"[agent] volume imagenet: {source} at {target} (read-only)" in log
    assert "labels: cat dog uid 393" in log  # read at its target, under the job's own uid
    assert not Path(target).exists()  # made in the job's view only
    # Nothing of the volume roots at their host paths: another team's volume there is out of reach.
    (tmp_path / "volumes" / "other-team").mkdir(mode=0o755)
    (tmp_path / "volumes" / "other-team" / "weights.txt").write_text("not yours")
    (tmp_path / "volumes" / "other-team" / "weights.txt").chmod(0o644)
    peek = MountSpec("imagenet", str(source), target)
    state, reason, log = run(runner, console, peek, 4, read=tmp_path / "volumes" / "other-team" / "weights.txt")
    assert state == "failed" and "FileNotFoundError" in log and "not yours" not in log
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    state, reason, log = run(runner, console, MountSpec("other", str(outside), "/mnt/other"), 3)
    assert state == "failed" and "is outside this host's volume roots" in reason, (reason, log)
