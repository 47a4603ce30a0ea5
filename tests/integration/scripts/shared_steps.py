"""A training job that leaves its GPU mostly idle: each step waits WAIT_S on its "data" (sleeps), then computes
COMPUTE_S (a busy loop, what the simulated GPU shows as utilization). The compute phase holds a lock per simulated
GPU (an abstract unix socket named after KEY and CUDA_VISIBLE_DEVICES: jobs have private /tmp folders, not a
private network), so jobs sharing a GPU time-slice its compute as they would on a real one, and their step times
show the slowdown. It reports every step as the runtime does (steps_per_s, wait_fraction) until stopped.

usage: shared_steps.py COMPUTE_S WAIT_S KEY
"""

import json
import os
import socket
import sys
import time

compute_s, wait_s = float(sys.argv[1]), float(sys.argv[2])
lock_name = f"\0console-it-gpu-{sys.argv[3]}-{os.environ.get('CUDA_VISIBLE_DEVICES', 'none')}"
progress = os.environ["CONSOLE_PROGRESS_FILE"]


def hold_gpu() -> socket.socket:
    while True:
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(lock_name)
            return lock
        except OSError:
            lock.close()
            time.sleep(0.002)


step = 0
while True:
    began = time.perf_counter()
    time.sleep(wait_s)
    waited = time.perf_counter() - began
    lock = hold_gpu()
    try:
        spin_until = time.perf_counter() + compute_s
        while time.perf_counter() < spin_until:
            pass
    finally:
        lock.close()
    step += 1
    took = time.perf_counter() - began
    record = {"type": "progress", "step": step, "steps_per_s": 1 / took, "wait_fraction": waited / took,
              "ts": time.time()}
    with open(progress, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
