"""Holds MiB of memory (argv[1]) for argv[2] seconds: on a simulated GPU that is GPU memory the job uses."""

import sys
import time

block = bytearray(int(sys.argv[1]) * 1024 * 1024)
for offset in range(0, len(block), 4096):  # touch every page so it is really resident
    block[offset] = 1
print(f"holding {sys.argv[1]} MiB", flush=True)
time.sleep(float(sys.argv[2]))
