"""What runs inside a job: presets applied to user PyTorch code, progress reports, checkpoints.

No Django, no Celery: this package is imported by job processes on GPU hosts. Importing the package
(and `catalog`) stays cheap; torch is imported by the modules that need it.

    session       the API a training/inference script calls (start, prepare, step_context, report...)
    catalog       presets and built-in workloads, as plain data (shared with the console)
    run_builtin   `python -m workers.runtime.run_builtin --workload NAME --kind train|inference`
    artifacts     where job outputs are kept (directory or S3-compatible bucket)
    presets, precision, distributed, checkpoint, inference, reporting, env: the parts session uses

Environment (set by the agent): CONSOLE_JOB_ID, CONSOLE_PRESET, CONSOLE_MAX_STEPS, CONSOLE_PROGRESS_FILE,
CONSOLE_CHECKPOINT_DIR, CONSOLE_CHECKPOINT_EVERY, CONSOLE_OUTPUT_DIR, CONSOLE_MODEL_PATH, CONSOLE_DEVICE;
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT come from torchrun.

`report_metrics(step=..., val_acc=...)` reports a job's own named metrics from any script (no torch needed).
"""

from .reporting import report_metrics

__all__ = ["report_metrics"]
