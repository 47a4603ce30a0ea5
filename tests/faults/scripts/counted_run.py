"""A job that records each start and each completion in <runs_dir>/<job id>, so a test can prove that no job
ran to completion twice. Usage: counted_run.py RUNS_DIR SECONDS"""

import os
import sys
import time
from pathlib import Path

runs = Path(sys.argv[1]) / os.environ.get("CONSOLE_JOB_ID", "unknown")
attempt = os.environ.get("CONSOLE_ATTEMPT", "?")


def note(event: str) -> None:
    with runs.open("a") as handle:
        handle.write(f"{event} attempt={attempt} pid={os.getpid()}\n")


note("start")
os.write(1, f"proc pid={os.getpid()} attempt={attempt}\n".encode())
time.sleep(float(sys.argv[2]))
note("done")
