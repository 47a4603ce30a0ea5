"""A job that keeps one core busy for SECONDS, printing a line a second (tests/browser/test_live_console.py).

It lives in the checkout: a job sees only what it was given, not a test's temporary folder."""

import os
import sys
import time

seconds = float(sys.argv[1])
start = last = time.time()
os.write(1, b"burn start\n")
while time.time() - start < seconds:  # one busy core: the simulated GPU reports it as SM utilization
    if time.time() - last >= 1:
        last = time.time()
        os.write(1, f"burn {round(last - start)}\n".encode())
os.write(1, b"burn done\n")
