"""A training job with a steady step time: STEP_S per step for CONSOLE_MAX_STEPS steps, reporting its progress
after every step as the runtime does (CONSOLE_PROGRESS_FILE). Used by the start-estimate integration test."""

import json
import os
import sys
import time

step_s = float(sys.argv[1])
max_steps = int(os.environ["CONSOLE_MAX_STEPS"])
progress = os.environ["CONSOLE_PROGRESS_FILE"]
for step in range(1, max_steps + 1):
    time.sleep(step_s)
    with open(progress, "a", encoding="utf-8") as fh:
        fh.write(
            json.dumps(
                {
                    "type": "progress",
                    "step": step,
                    "max_steps": max_steps,
                    "steps_per_s": 1 / step_s,
                    "ts": time.time(),
                }
            )
            + "\n"
        )
print(f"done {max_steps} steps", flush=True)
