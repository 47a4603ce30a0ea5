"""Per-job cgroups (workers/agent/cgroups.py) on this machine's real cgroups, and the v2 code path on a fake tree.

This machine mounts cgroup v1 controllers (memory, cpu, pids, devices …) beside an empty v2 tree, so the tests that
need a real hierarchy run the v1 code: a real cgroup, real processes started through the real shim, real limits
(the kernel's OOM killer, pids.max's EAGAIN, the CFS quota, the devices controller). They skip, saying why, where
the tests are not root or no hierarchy is writable. cgroup v2 is not mounted here with controllers: its code path
is checked against a fake directory tree for the file names it writes and what it writes there, not the kernel's
behaviour.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from workers.agent import cgroups
from workers.agent.cgroups import CgroupSupport, JobCgroup, Layout, Limits
from workers.protocol import Dispatch, ProtocolError

MB = 1024**2
HOST = "test-host"


def _real_support(tmp_path: Path | None = None) -> CgroupSupport:
    if os.geteuid() != 0:
        pytest.skip(f"needs root to create cgroups (running as uid {os.geteuid()})")
    layout = cgroups.detect()
    if layout.version == "none":
        pytest.skip(f"no writable cgroup hierarchy: {layout.reason}")
    support = CgroupSupport(layout, parent=f"gpu-agent-test-{uuid.uuid4().hex[:8]}",
                            dev_dir=tmp_path or Path("/dev"))
    if support.off_reason(HOST):
        pytest.skip(f"cgroups not usable here: {support.off_reason(HOST)}")
    return support


@pytest.fixture
def support(tmp_path):
    support = _real_support(tmp_path)
    yield support
    for folder in support.host_dirs(HOST).values():  # the host's and the agent's folders, once jobs are gone
        for path in (folder, folder.parent):
            for child in path.glob("job-*"):
                cgroups._remove_dir(child)
            cgroups._remove_dir(path)


def shim(group: JobCgroup, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A job run as the agent runs it: through the shim, joining `group` before exec."""
    return subprocess.run([sys.executable, "-m", "workers.agent.shim", "--grace", "1", *group.shim_options(),
                           "--", *argv], capture_output=True, text=True, timeout=timeout)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


# --- real cgroups


def test_this_machine_layout_is_detected():
    layout = cgroups.detect()
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        assert layout.version in ("v2", "none")
    elif Path("/sys/fs/cgroup/memory/cgroup.procs").exists() and Path("/sys/fs/cgroup/pids/cgroup.procs").exists():
        assert layout.version == "v1"
        assert {"memory", "pids"} <= set(layout.mounts)
    else:
        pytest.skip("neither cgroup layout is mounted here")


def test_job_past_its_memory_limit_is_killed_and_counted(support):
    group = support.job(HOST, 1, 1, Limits(memory_bytes=64 * MB, pids=64))
    try:
        result = shim(group, *python("""
            chunks = []
            for _ in range(64):
                chunks.append(bytearray(16 * 1024 * 1024))  # zero-filled: every page is touched
            print("allocated 1 GB", flush=True)
        """))
        assert result.returncode == -signal.SIGKILL, result
        assert "allocated 1 GB" not in result.stdout
        assert group.oom_killed(result.returncode)
        assert group.oom_reason() == "out of memory: the job exceeded its memory limit of 0.0625 GB"
        peak = group.peak_memory_bytes()
        assert peak is None or peak <= 64 * MB
    finally:
        group.remove()
    assert not any(folder.exists() for folder in group.dirs.values())


def test_job_within_its_limits_succeeds_and_is_not_called_out_of_memory(support):
    group = support.job(HOST, 2, 1, Limits(cpus=0.5, memory_bytes=256 * MB, pids=64))
    try:
        result = shim(group, *python("data = bytearray(32 * 1024 * 1024); print('ok', len(data))"))
        assert result.returncode == 0, result
        assert not group.oom_killed(result.returncode)
        assert group.oom_kills() == 0
    finally:
        group.remove()


def test_only_the_job_joins_its_cgroup_the_shim_stays_outside(support):
    group = support.job(HOST, 3, 1, Limits(memory_bytes=256 * MB))
    try:
        # The job prints its own and its parent's (the shim's) memory cgroup.
        result = shim(group, *python("""
            import os
            def memcg(pid):
                lines = open(f"/proc/{pid}/cgroup").read().splitlines()
                return next(line.split(":", 2)[2] for line in lines if line.split(":")[1] in ("memory", ""))
            print(memcg(os.getpid()))
            print(memcg(os.getppid()))
        """))
        assert result.returncode == 0, result
        job_cgroup, shim_cgroup = result.stdout.split()
        assert job_cgroup.endswith("/job-3-1")
        assert "job-3-1" not in shim_cgroup
    finally:
        group.remove()


def test_fork_bomb_is_bounded_by_pids_max(support):
    group = support.job(HOST, 4, 1, Limits(pids=16))
    try:
        result = shim(group, *python("""
            import errno, os, time
            children = []
            try:
                for _ in range(200):
                    pid = os.fork()
                    if pid == 0:
                        time.sleep(30)
                        os._exit(0)
                    children.append(pid)
            except OSError as exc:
                print("forks", len(children), "refused", errno.errorcode[exc.errno], flush=True)
            for pid in children:
                os.kill(pid, 9)
        """))
        assert result.returncode == 0, result
        words = result.stdout.split()
        assert words[0] == "forks" and int(words[1]) < 16, result.stdout
        assert words[3] == "EAGAIN"
        assert (group.dirs["pids" if group.version == "v1" else "unified"] / "pids.max").read_text().strip() == "16"
    finally:
        group.remove()


def test_cpu_quota_bounds_a_busy_job(support):
    group = support.job(HOST, 5, 1, Limits(cpus=0.2))
    try:
        if group.version == "v1":
            cpu = group.dirs["cpu"]
            assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "20000"
            assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        # Busy for 1.5 s: the CPU time it got over the interval it measured itself, which the quota bounds by
        # 0.2 x the interval plus one period's burst. Both are CPU time and its own interval, not the test's
        # wall clock: a loaded machine only gives it less CPU (and unquota'd it would get ~1 CPU: 1.5 s).
        result = shim(group, *python("""
            import time
            cpu, start = time.process_time(), time.monotonic()
            while time.monotonic() - start < 1.5:
                pass
            print(time.process_time() - cpu, time.monotonic() - start)
        """))
        assert result.returncode == 0, result
        cpu, interval = map(float, result.stdout.split())
        assert cpu <= 0.2 * interval + 0.15, result.stdout
    finally:
        group.remove()


def test_remove_kills_what_is_left_and_removes_the_cgroup(support):
    group = support.job(HOST, 6, 1, Limits(memory_bytes=128 * MB))
    files = [str(path) for path in group.procs_files()]
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            preexec_fn=lambda: cgroups.join(files))  # noqa: PLW1509 - joining is the point
    try:
        assert str(left.pid) in group.procs_files()[0].read_text().split()
        group.remove()
        assert left.wait(timeout=30) == -signal.SIGKILL
        assert not any(folder.exists() for folder in group.dirs.values())
    finally:
        if left.poll() is None:
            left.kill()


def test_shim_refuses_to_run_a_job_it_cannot_put_in_its_cgroup(tmp_path):
    marker = tmp_path / "ran"
    result = subprocess.run([sys.executable, "-m", "workers.agent.shim", "--cgroup-procs",
                             str(tmp_path / "missing" / "cgroup.procs"), "--", "touch", str(marker)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 126
    assert "could not start the job in its cgroup" in result.stderr
    assert not marker.exists()


def _mknod(path: Path, major: int, minor: int) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except PermissionError as exc:
        pytest.skip(f"cannot create device nodes here: {exc}")


def test_devices_cgroup_denies_other_gpus_nodes(support, tmp_path):
    if support.layout.version != "v1" or "devices" not in support.layout.mounts:
        pytest.skip("needs the cgroup v1 devices controller")
    for minor in (3, 5):
        _mknod(tmp_path / f"nvidia{minor}", cgroups.NVIDIA_MAJOR, minor)
    group = support.job(HOST, 7, 1, Limits(), gpu_minors=[5])
    try:
        assert group.devices_denied == [str(tmp_path / "nvidia3")]
        # No driver behind these nodes: opening an allowed one says ENXIO, a denied one EPERM (the cgroup).
        result = shim(group, *python(f"""
            import errno
            for name in ("nvidia3", "nvidia5"):
                try:
                    open("{tmp_path}/" + name, "rb")
                except OSError as exc:
                    print(name, errno.errorcode[exc.errno])
        """))
        assert result.returncode == 0, result
        assert result.stdout.split() == ["nvidia3", "EPERM", "nvidia5", "ENXIO"]
    finally:
        group.remove()


# --- device nodes, without GPUs


def test_device_nodes_to_deny_are_the_other_gpus_only(tmp_path):
    for minor in range(4):
        _mknod(tmp_path / f"nvidia{minor}", cgroups.NVIDIA_MAJOR, minor)
    _mknod(tmp_path / "nvidiactl", cgroups.NVIDIA_MAJOR, 255)
    _mknod(tmp_path / "nvidia-modeset", cgroups.NVIDIA_MAJOR, 254)
    _mknod(tmp_path / "nvidia-uvm", 508, 0)
    _mknod(tmp_path / "nvidia-uvm-tools", 508, 1)
    (tmp_path / "nvidia9").write_text("not a device")
    denied = cgroups.denied_device_nodes([1, 2], tmp_path)
    assert [node.path.name for node in denied] == ["nvidia0", "nvidia3"]
    assert [node.rule() for node in denied] == ["c 195:0 rwm", "c 195:3 rwm"]
    allowed = cgroups.allowed_device_nodes([1, 2], tmp_path)
    assert [node.path.name for node in allowed] == ["nvidia1", "nvidia2", "nvidia-uvm", "nvidia-uvm-tools",
                                                   "nvidiactl"]


def test_device_rules_written_for_a_fake_devices_cgroup(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor in range(3):
        _mknod(dev / f"nvidia{minor}", cgroups.NVIDIA_MAJOR, minor)
    _mknod(dev / "nvidiactl", cgroups.NVIDIA_MAJOR, 255)
    folder = tmp_path / "devices" / "job"
    folder.mkdir(parents=True)
    for name in ("devices.deny", "devices.allow"):  # plain files stand in for the kernel's (writes append)
        (folder / name).write_text("")
    group = JobCgroup("v1", {"devices": folder}, Limits())
    group.restrict_devices(cgroups.denied_device_nodes([1], dev), cgroups.allowed_device_nodes([1], dev))
    assert (folder / "devices.deny").read_text() == "c 195:0 rwmc 195:2 rwm"
    assert (folder / "devices.allow").read_text() == "c 195:1 rwmc 195:255 rwm"
    assert group.devices_denied == [str(dev / "nvidia0"), str(dev / "nvidia2")]


# --- cgroup v2, on a fake tree (file names and values only; v2 is not mounted here)


def _fake_v2(root: Path, host: str, job: str) -> Path:
    """What the kernel would show: interface files in the root, the agent's folders and the job's."""
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    folder = root
    for part in ("gpu-agent", host, job):
        (folder / "cgroup.subtree_control").write_text("")
        folder = folder / part
        folder.mkdir()
    for name in ("cgroup.procs", "memory.max", "memory.swap.max", "memory.oom.group", "cpu.max", "pids.max",
                 "memory.events", "memory.peak", "cgroup.kill", "cgroup.subtree_control"):
        (folder / name).write_text("")
    return folder


def test_v2_path_writes_memory_swap_cpu_and_pids_limits(tmp_path):
    folder = _fake_v2(tmp_path, HOST, "job-9-2")
    support = CgroupSupport(Layout("v2", tmp_path, {"unified": tmp_path}), parent="gpu-agent")
    assert support.off_reason(HOST) == ""
    # Controllers enabled on the way down to the host's folder, so that job cgroups get them.
    for path in (tmp_path, tmp_path / "gpu-agent", tmp_path / "gpu-agent" / HOST):
        assert (path / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    group = support.job(HOST, 9, 2, Limits(cpus=1.5, memory_bytes=2 * 1024**3, pids=512))
    assert group.dirs == {"unified": folder}
    assert (folder / "memory.max").read_text() == str(2 * 1024**3)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "memory.oom.group").read_text() == "1"
    assert (folder / "cpu.max").read_text() == "150000 100000"
    assert (folder / "pids.max").read_text() == "512"
    assert group.shim_options() == ["--cgroup-procs", str(folder / "cgroup.procs")]


def test_v2_oom_kills_come_from_memory_events(tmp_path):
    folder = _fake_v2(tmp_path, HOST, "job-9-3")
    group = JobCgroup("v2", {"unified": folder}, Limits(memory_bytes=1024**3))
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n")
    assert not group.oom_killed(-9)
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 1\n")
    assert group.oom_killed(-9)
    assert group.oom_reason() == "out of memory: the job exceeded its memory limit of 1 GB"
    (folder / "memory.peak").write_text(str(300 * MB))
    assert group.peak_memory_bytes() == 300 * MB


def test_v1_without_an_oom_kill_counter_uses_failcnt_and_sigkill(tmp_path):
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # kernels before 4.13
    (tmp_path / "memory.failcnt").write_text("3\n")
    group = JobCgroup("v1", {"memory": tmp_path}, Limits(memory_bytes=512 * MB))
    assert group.oom_killed(-signal.SIGKILL)
    assert not group.oom_killed(1)
    (tmp_path / "memory.failcnt").write_text("0\n")
    assert not group.oom_killed(-signal.SIGKILL)


def test_v2_inner_node_with_processes_turns_limits_off_with_the_reason(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    support = CgroupSupport(Layout("v2", tmp_path, {"unified": tmp_path}), parent="gpu-agent")
    # The fake's new folder has no interface files: the kernel would have made them; the setup fails, and says so.
    reason = support.off_reason(HOST)
    assert reason.startswith("could not prepare the agent's cgroups")
    assert support.job(HOST, 1, 1, Limits()) is None
    assert support.describe(_dispatch()) == {"applied": False, "reason": reason}


def test_no_hierarchy_or_not_root_says_why(tmp_path):
    layout = cgroups.detect(tmp_path)
    assert layout.version == "none" and str(tmp_path) in layout.reason
    support = CgroupSupport(layout)
    assert not support.enabled
    assert support.describe(_dispatch()) == {"applied": False, "reason": layout.reason}


def test_hybrid_layout_is_v1(tmp_path):
    for name in ("memory", "cpu", "pids", "devices"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").write_text("")
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("")
    layout = cgroups.detect(tmp_path)
    assert layout.version == "v1" and set(layout.mounts) == {"memory", "cpu", "pids", "devices"}


def test_v1_job_folders_nest_under_the_agents_own_cgroups(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("5:devices:/\n4:memory:/svc/agent\n1:cpu,cpuacct:/\n8:pids:/svc\n0::/\n")
    mounts = {name: tmp_path / name for name in ("memory", "cpu", "pids", "devices")}
    support = CgroupSupport(Layout("v1", tmp_path, mounts), parent="gpu-agent", proc_file=proc)
    assert support.host_dirs("h/1") == {
        "memory": tmp_path / "memory/svc/agent/gpu-agent/h_1", "cpu": tmp_path / "cpu/gpu-agent/h_1",
        "pids": tmp_path / "pids/svc/gpu-agent/h_1", "devices": tmp_path / "devices/gpu-agent/h_1"}


def test_cpu_quota_of_fractional_cpus():
    assert cgroups.cfs_quota_us(2) == 200_000
    assert cgroups.cfs_quota_us(0.25) == 25_000
    assert cgroups.cfs_quota_us(0.001) == cgroups.CFS_MIN_QUOTA_US


# --- the dispatch carries the limits


def _dispatch(**extra) -> Dispatch:
    return Dispatch(job_id=1, attempt=1, host=HOST, gpu_indices=(0,), kind="train", preset="baseline-fp32",
                    workload={"builtin": "mlp-digits"}, time_limit_s=60, **extra)


def test_dispatch_carries_cpus_and_memory_and_older_messages_still_parse():
    message = _dispatch(cpus=2.5, memory_gb=0.25).to_message()
    parsed = Dispatch.from_message(message)
    assert (parsed.cpus, parsed.memory_gb) == (2.5, 0.25)
    del message["cpus"], message["memory_gb"]
    assert (Dispatch.from_message(message).cpus, Dispatch.from_message(message).memory_gb) == (None, None)
    for bad in (0, -1, "many", float("nan")):
        with pytest.raises(ProtocolError):
            Dispatch.from_message({**message, "cpus": bad})


def test_limits_from_a_dispatch():
    limits = Limits.of(2.0, 0.25)
    assert limits.memory_bytes == 256 * MB and limits.cpus == 2.0 and limits.pids == cgroups.DEFAULT_PIDS_MAX
    assert limits.describe() == {"cpus": 2.0, "memory_gb": 0.25, "pids": cgroups.DEFAULT_PIDS_MAX}
    assert Limits.of(None, None).memory_bytes is None


def test_an_agent_not_run_as_root_turns_limits_off_and_says_why(caplog):
    if os.geteuid() != 0 or cgroups.detect().version == "none":
        pytest.skip("needs root (to act as nobody for a moment) and a cgroup hierarchy")
    os.setegid(65534)
    os.seteuid(65534)
    try:
        support = CgroupSupport(parent="gpu-agent")
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert not support.enabled and "not writable by this agent (uid 65534)" in support.reason
    assert support.job(HOST, 1, 1, Limits()) is None
    assert support.describe(_dispatch()) == {"applied": False, "reason": support.reason}
    assert "job limits are off" in caplog.text


def test_job_cgroups_left_by_a_previous_run_are_removed_when_the_agent_starts(tmp_path):
    support = _real_support(tmp_path)
    left = support.job(HOST, 11, 1, Limits(memory_bytes=128 * MB))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                               preexec_fn=lambda: cgroups.join([str(p) for p in left.procs_files()]))  # noqa: PLW1509
    try:
        again = CgroupSupport(support.layout, parent=support.parent)  # the agent, restarted
        assert again.off_reason(HOST) == ""
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
        assert not any(folder.exists() for folder in left.dirs.values())
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        for folder in support.host_dirs(HOST).values():
            for path in (folder, folder.parent):
                cgroups._remove_dir(path)
