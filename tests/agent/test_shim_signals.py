"""The shim waits on signals, never polling: an idle job's tree costs no CPU, and stopping still works."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

SHIM = [sys.executable, "-m", "workers.agent.shim"]


def start(tmp_path: Path, script: str, grace_s: float = 5.0) -> subprocess.Popen[str]:
    return subprocess.Popen([*SHIM, "--grace", str(grace_s), "--stop-file", str(tmp_path / "stop-grace"), "--",
                             sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def wait_for_line(shim: subprocess.Popen[str], expected: str) -> str:
    assert shim.stdout is not None
    line = shim.stdout.readline()
    assert line.startswith(expected), line
    return line


def wake_ups(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_the_shim_sleeps_while_its_job_does(tmp_path: Path) -> None:
    """The simulated GPU reads a job's tree CPU as utilization: a shim polling 20 times a second read as a busy GPU
    now and then on a loaded host and called off an idle job's release."""
    shim = start(tmp_path, "print('up', flush=True); import time; time.sleep(60)")
    try:
        wait_for_line(shim, "up")
        before = wake_ups(shim.pid)
        time.sleep(1.0)  # a window to count wake-ups in, not a wait for an event
        assert wake_ups(shim.pid) - before <= 1
    finally:
        shim.terminate()
        shim.wait(timeout=30)


def test_the_job_starts_with_no_signal_blocked(tmp_path: Path) -> None:
    shim = start(tmp_path, "print([l for l in open('/proc/self/status') if l.startswith('SigBlk')][0], end='')")
    line = wait_for_line(shim, "SigBlk")
    assert int(line.split()[1], 16) == 0, line
    assert shim.wait(timeout=30) == 0


def test_sigterm_reaches_the_job_and_the_shim_ends_as_it_did(tmp_path: Path) -> None:
    shim = start(tmp_path, "import time; print('up', flush=True); time.sleep(60)")
    wait_for_line(shim, "up")
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(timeout=30) == -signal.SIGTERM


def test_a_job_ignoring_sigterm_is_killed_once_its_grace_is_over(tmp_path: Path) -> None:
    script = ("import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('term', flush=True)); "
              "print('up', flush=True); time.sleep(60)")
    shim = start(tmp_path, script, grace_s=0.5)
    wait_for_line(shim, "up")
    shim.send_signal(signal.SIGTERM)
    wait_for_line(shim, "term")
    assert shim.wait(timeout=30) == -signal.SIGKILL


def test_what_the_job_left_running_ends_with_it(tmp_path: Path) -> None:
    script = ("import subprocess, sys; child = subprocess.Popen(['sleep', '60'], start_new_session=True); "
              "print('left', child.pid, flush=True); sys.exit(3)")
    shim = start(tmp_path, script)
    left = int(wait_for_line(shim, "left").split()[1])
    assert shim.wait(timeout=30) == 3
    assert not Path(f"/proc/{left}").exists()  # killed and reaped by the shim before it exited
