"""A job that records each start and each completion in its own outputs (runs.log, which every attempt of the job
is given back), so a test can prove that no job ran to completion twice. Usage: counted_run.py SECONDS

A job sees only its own folders: it cannot write down its runs anywhere else on the host.
"""

import os
import sys
import time
from pathlib import Path

runs = Path(os.environ["CONSOLE_OUTPUT_DIR"]) / "runs.log"
attempt = os.environ.get("CONSOLE_ATTEMPT", "?")


def note(event: str) -> None:
    with runs.open("a") as handle:
        handle.write(f"{event} attempt={attempt} pid={os.getpid()}\n")


note("start")
os.write(1, f"proc pid={os.getpid()} attempt={attempt}\n".encode())
time.sleep(float(sys.argv[1]))
note("done")
