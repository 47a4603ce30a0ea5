"""A user's training script, as far as reports go: progress every step, its own val_acc every 10 steps (through
workers.runtime.report_metrics, with a badly named one the runtime drops), no torch."""

import time

from workers.runtime import report_metrics
from workers.runtime.env import RuntimeEnv
from workers.runtime.reporting import Reporter

STEPS = 40
env = RuntimeEnv.from_env()
reporter = Reporter(env.progress_file, enabled=env.is_main)
for step in range(1, STEPS + 1):
    reporter.progress(step=step, max_steps=STEPS, loss=1.0 / step, steps_per_s=20.0, samples_per_s=640.0)
    if step % 10 == 0:
        report_metrics(step=step, val_acc=step / STEPS, **{"not a name": 1.0})
    time.sleep(0.05)  # a few of the agent's one-second reads: the records arrive in several batches
