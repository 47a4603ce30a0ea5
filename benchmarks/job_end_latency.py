"""How long a job's end takes to reach the console: the process's exit time beside the finished_at recorded.

    .venv/bin/python benchmarks/job_end_latency.py [--jobs 5] [--preset baseline-fp32|ddp]

Starts a live console on this machine (tests/integration/live.py: ASGI server, Celery worker with beat, one agent
with 2 simulated H200s), submits --jobs jobs one after another whose command prints its own exit time
(time.time()) as its last act and exits, and prints, per job and as median and max, finished_at minus the exit
the agent saw (its final report's exited_at, kept in the end's event), and minus the job's own last print (with
--preset ddp that includes torchrun's shutdown after its workers exit). The processes share this machine's clock.
Not a test: it prints figures.

Measured 2026-12-03 on the 2-core helper machine (other work running): baseline-fp32, 4 jobs: from the exit the
agent saw median 0.128 s, max 0.284 s (from the job's last print 0.430 s); ddp, 3 jobs: median 0.127 s, max 0.182 s
(from the workers' last print 3.8 s: torchrun's own shutdown, inside the job).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))



def main() -> None:
    if sys.argv[1:] == ["--print-exit"]:  # the jobs' command (torchrun runs a script, not -c)
        print(f"exit_at={time.time()!r}", flush=True)
        return
    from tests.integration.live import LiveCluster, create_team

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--preset", default="baseline-fp32")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        live = LiveCluster(Path(folder), agents={"bench-a": "2xH200"})
        try:
            live.start()
            create_team(live.admin(), "bench", 2)
            latencies: list[float] = []
            in_job: list[float] = []
            gpus = 2 if args.preset in ("ddp", "fsdp") else 1
            for _ in range(args.jobs):
                job = live.submit(team="bench", gpus=gpus, preset=args.preset,
                                  workload={"command": [sys.executable, __file__, "--print-exit"]})
                done = live.wait_state(job["id"], {"succeeded", "failed"}, timeout=300)
                log = live.log(job["id"])
                exits = [float(value) for value in re.findall(r"exit_at=([0-9.]+)", log)]
                if not exits:
                    raise SystemExit(f"job {job['id']} printed no exit time:\n{log[-3000:]}")
                finished = datetime.fromisoformat(done["finished_at"]).timestamp()
                events = live.admin().get(f"/api/v1/jobs/{job['id']}/events/").json()["results"]
                seen = next(e["data"]["exited_at"] for e in events if e["to_state"] == done["state"])
                latencies.append(finished - seen)
                in_job.append(finished - max(exits))
                print(f"job {job['id']}: {done['state']}; finished_at - exit the agent saw = {finished - seen:.3f} s, "
                      f"finished_at - the job's last print = {finished - max(exits):.3f} s", flush=True)
            print(f"{args.preset}, {len(latencies)} jobs: finished_at - exit the agent saw: median "
                  f"{statistics.median(latencies):.3f} s, max {max(latencies):.3f} s; from the job's last print "
                  f"(torchrun's own shutdown included): median {statistics.median(in_job):.3f} s")
        finally:
            live.stop()


if __name__ == "__main__":
    main()
