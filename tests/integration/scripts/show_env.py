"""Prints what a job process sees, then waits; used by the integration tests."""

import os
import sys
import time

line = (f"proc pid={os.getpid()} pgid={os.getpgid(0)} cvd={os.environ.get('CUDA_VISIBLE_DEVICES')} "
      f"local_rank={os.environ.get('LOCAL_RANK')} rank={os.environ.get('RANK')} "
      f"world={os.environ.get('WORLD_SIZE')} preset={os.environ.get('CONSOLE_PRESET')}\n")
os.write(1, line.encode())  # one write, so the lines of several processes sharing the pipe never interleave
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
