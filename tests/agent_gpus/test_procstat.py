"""/proc reading for the simulated backend: stat parsing, process trees, the no-children-files fallback."""

from __future__ import annotations

import os
import time

from tests.agent_gpus.conftest import BUSY, TREE
from workers.agent.gpus import procstat
from workers.agent.gpus.procstat import ProcessTreeMeter, read_stat


def test_read_stat_of_this_process():
    st = read_stat(os.getpid())
    assert st is not None and st.pid == os.getpid() and st.ppid == os.getppid()
    assert st.state in "RS" and st.rss_bytes > 0 and st.cpu_ticks >= 0 and st.start_ticks > 0
    assert read_stat(2**22 + 12345) is None  # above pid_max: never exists


def test_read_stat_with_awkward_command_name(tmp_path):
    (tmp_path / "42").mkdir()
    rest = " ".join(["S", "7", "42"] + ["0"] * 8 + ["150", "50"] + ["0"] * 6 + ["9999", "0", "25"])
    (tmp_path / "42" / "stat").write_text(f"42 (my (weird) name) {rest} 0 0\n")
    st = read_stat(42, proc=str(tmp_path))
    assert (st.state, st.ppid, st.pgrp, st.cpu_ticks, st.start_ticks) == ("S", 7, 42, 200, 9999)
    assert st.rss_bytes == 25 * procstat.PAGE_SIZE


def test_first_reading_has_no_burst_then_cpu_is_measured(spawn):
    busy = spawn(BUSY)
    time.sleep(1.0)  # it has already burnt CPU before we look
    meter = ProcessTreeMeter()
    first = meter.measure([busy.pid])[busy.pid]
    assert first.alive and first.cpu_cores == 0.0 and first.pids == (busy.pid,)
    time.sleep(1.0)
    second = meter.measure([busy.pid])[busy.pid]
    # Some CPU, and one core at most: how much a busy loop gets depends on how busy the machine is.
    assert 0.0 < second.cpu_cores <= 1.2
    # Readings closer than min_interval_s repeat the previous one instead of measuring tick noise.
    assert meter.measure([busy.pid])[busy.pid] is second


def test_tree_without_children_files_uses_full_scans(spawn, monkeypatch):
    monkeypatch.setattr(procstat, "_children", lambda pid, proc: None)
    launcher = spawn(TREE)
    meter = ProcessTreeMeter(group_scan_s=1e9, walk_interval_s=0)
    deadline = time.monotonic() + 20
    usage = meter.measure([launcher.pid])[launcher.pid]
    while len(usage.pids) < 3 and time.monotonic() < deadline:
        time.sleep(0.3)
        usage = meter.measure([launcher.pid])[launcher.pid]
    assert len(usage.pids) == 3 and usage.pids[0] == launcher.pid
    time.sleep(1.0)
    # The launcher only sleeps: CPU measured for its tree is its busy children's, found without children files.
    # Not a share of a core: on a loaded machine two busy loops may get little of one.
    assert meter.measure([launcher.pid])[launcher.pid].cpu_cores > 0.05


def test_dead_root_is_not_alive(spawn):
    proc = spawn("pass")
    proc.wait()
    usage = ProcessTreeMeter().measure([proc.pid])[proc.pid]
    assert not usage.alive and usage.pids == () and usage.rss_mb == 0
