"""Time one console pass over the synthetic 10,000-job snapshot with the scheduling core found under a code root.

    python benchmarks/pass_clock.py CODE_ROOT PASSES

Prints a JSON list of each pass's CPU seconds. `benchmarks/scheduler.py` runs it on this checkout and on the
core as it was before the speed-up (extracted from git), turn about, so that both figures come from one machine
in one run: a pass's milliseconds move with the machine (the same pass has taken 69 to 260 ms here on different
days), their ratio much less.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    code_root, passes = argv[1], int(argv[2])
    sys.path.insert(0, code_root)
    from apps.scheduling.policy import schedule
    from apps.scheduling.synthetic import synthetic_snapshot

    snapshot = synthetic_snapshot(pending=10_000, hosts=128, gpus_per_host=8)
    schedule(snapshot)  # warm-up
    timings = []
    for _ in range(passes):
        started = time.process_time()
        schedule(snapshot)
        timings.append(time.process_time() - started)
    print(json.dumps(timings))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
