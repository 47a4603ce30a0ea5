"""CPU cost of the GPU sampler: the simulated backend, 8 GPUs, sampled at 1 Hz, with real jobs attached.

    .venv/bin/python benchmarks/sampler_cost.py [--gpus 8] [--seconds 20] [--hz 1]

Every GPU gets a job shaped like a torchrun launch (a launcher process and a worker with 32 threads), so
each sample walks real process trees in /proc; a fault file is watched and an XID poller thread waits, as in
the agent. The figure that matters is the CPU time this process uses per second of wall time (all its
threads), as a share of one core: it must stay well under 1 %.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from workers.agent.gpus import SimulatedBackend  # noqa: E402

JOB = (
    "import subprocess, sys\n"
    "worker = ('import threading, time\\n'\n"
    "          'for _ in range(32): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\\n'\n"
    "          'time.sleep(600)\\n')\n"
    "subprocess.Popen([sys.executable, '-c', worker]).wait()\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hz", type=float, default=1.0)
    args = parser.parse_args()

    jobs = [subprocess.Popen([sys.executable, "-c", JOB], start_new_session=True) for _ in range(args.gpus)]
    try:
        time.sleep(2.0)  # let the launchers start their workers
        with tempfile.TemporaryDirectory() as tmp:
            fault_file = Path(tmp) / "faults.json"
            fault_file.write_text("{}")
            backend = SimulatedBackend(f"{args.gpus}xH200", host_name="bench", fault_file=fault_file)
            for index, job in enumerate(jobs):
                backend.attach_job(index, job_id=index + 1, pid=job.pid)
            stop = threading.Event()

            def poll_xids() -> None:
                while not stop.is_set():
                    backend.poll_xid_events(1000)

            poller = threading.Thread(target=poll_xids, daemon=True)
            poller.start()
            backend.sample()  # warm-up: imports, first /proc walk, first group scan

            period = 1.0 / args.hz
            n = int(args.seconds * args.hz)
            call_cpu: list[float] = []
            call_wall: list[float] = []
            procs_seen = 0
            cpu0, wall0 = time.process_time(), time.monotonic()
            next_tick = wall0
            for _ in range(n):
                next_tick += period
                t_cpu, t_wall = time.thread_time(), time.perf_counter()
                samples = backend.sample()
                call_cpu.append(time.thread_time() - t_cpu)
                call_wall.append(time.perf_counter() - t_wall)
                procs_seen = sum(len(s.processes) for s in samples)
                time.sleep(max(0.0, next_tick - time.monotonic()))
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            stop.set()
            poller.join(timeout=2)
            backend.close()
    finally:
        for job in jobs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()

    per_s_ms = cpu / wall * 1000
    print(f"simulated backend: {args.gpus} GPUs, {args.hz:g} Hz, {n} samples over {wall:.1f} s")
    print(
        f"jobs attached: {args.gpus} (launcher + worker with 32 threads each); processes in last sample: {procs_seen}"
    )
    print(
        f"sample() per call: mean {sum(call_cpu) / n * 1000:.2f} ms CPU, max {max(call_cpu) * 1000:.2f} ms CPU, "
        f"mean {sum(call_wall) / n * 1000:.2f} ms wall"
    )
    print(
        f"process CPU per second (sampler + XID poller + fault-file watch): {per_s_ms:.2f} ms/s "
        f"= {per_s_ms / 10:.3f} % of one core"
    )


if __name__ == "__main__":
    main()
