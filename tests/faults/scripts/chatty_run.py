"""A job that prints numbered lines until its outputs hold a file `go`, then a burst larger than its output pipe,
writes down `burst.done` in its outputs, and prints some more lines. Usage: chatty_run.py

A test writes `go` once it has taken the console away: the burst then meets a console that does not answer.
"""

import os
import sys
import time
from pathlib import Path

outputs = Path(os.environ["CONSOLE_OUTPUT_DIR"])
number = 0


def line() -> None:
    global number
    print(f"line {number:05d}", flush=True)
    number += 1


deadline = time.monotonic() + 600  # never forever: a test that never says go gets a failed job
while not (outputs / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no go")
    line()
    time.sleep(0.05)
sys.stdout.write("".join(f"burst {j:04d} " + "b" * 1000 + "\n" for j in range(300)))  # 300 KB: some 5 pipes
sys.stdout.flush()
(outputs / "burst.done").touch()
for _ in range(100):
    line()
    time.sleep(0.02)
