"""Hangs in the suite name themselves instead of holding CI to its limit with nothing printed.

With CONSOLE_TEST_STACKS=PREFIX (set by .ci/run), each test process (pytest-xdist's controller and workers):
- writes every thread's stack to PREFIX-<pid>.txt when it gets SIGTERM (`timeout` in .ci/run stops a pass
  that overran), then ends as SIGTERM ends it;
- once its session is over, gives itself EXIT_GRACE_S to exit. A process still there by then is held by a thread
  (the interpreter joins every non-daemon thread and executor worker at exit): it writes every thread's stack
  and exits with its session's status, its results already reported.

A hang inside a test is pytest-timeout's (pyproject.toml). A file, not stderr: pytest's capture owns file
descriptor 2 by then. .ci/run prints every non-empty stacks file.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from typing import TextIO

import pytest

EXIT_GRACE_S = 120.0


def _stacks_file(config: pytest.Config) -> TextIO | None:
    return getattr(config, "_console_stacks", None)


def register(config: pytest.Config) -> None:
    prefix = os.environ.get("CONSOLE_TEST_STACKS")
    if not prefix:
        return
    stacks = open(f"{prefix}-{os.getpid()}.txt", "a")  # noqa: SIM115 (open for the process's life)
    config._console_stacks = stacks  # type: ignore[attr-defined]
    faulthandler.register(signal.SIGTERM, file=stacks, all_threads=True, chain=True)


def session_over(session: pytest.Session, exitstatus: int) -> None:
    session.config._console_exitstatus = int(exitstatus)  # type: ignore[attr-defined]


def arm_exit_watch(config: pytest.Config) -> None:
    stacks = _stacks_file(config)
    if stacks is None:
        return
    status = getattr(config, "_console_exitstatus", 1)

    def watch() -> None:
        time.sleep(EXIT_GRACE_S)
        stacks.write(f"== pid {os.getpid()}: not exited {EXIT_GRACE_S:.0f} s after its session ended; its threads:\n")
        stacks.flush()
        faulthandler.dump_traceback(file=stacks, all_threads=True)
        stacks.flush()
        os._exit(status)

    threading.Thread(target=watch, name="exit-watch", daemon=True).start()
