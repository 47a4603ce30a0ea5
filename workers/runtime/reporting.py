"""Progress reports for the agent: JSON lines appended to CONSOLE_PROGRESS_FILE, and log lines.

The records are workers/protocol.py's (TrainingProgress, CheckpointRecord, ResultRecord, ServingProgress);
a progress record may carry extra fields, which the file keeps and the agent does not forward. A job's own named
metrics go in a progress record's "metrics" object (`report_metrics`), which the console keeps and charts.

Only the main process (rank 0) writes; other ranks get a reporter that does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from workers.protocol import CheckpointRecord, ResultRecord, TrainingProgress, clean_metrics

log = logging.getLogger("workers.runtime")


def _clean(value: Any) -> Any:
    """JSON-safe values: NaN/inf become null, tensors and numpy scalars become Python numbers."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class Reporter:
    def __init__(self, path: Path | None, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, record: dict[str, Any]) -> dict[str, Any]:
        """Append one JSON line (with a timestamp) and return it."""
        raw = {"type": record["type"], "ts": time.time(), **{k: v for k, v in record.items() if k != "type"}}
        line: dict[str, Any] = _clean(raw)
        if self.enabled and self.path is not None:
            # One write per line in append mode, so a reader tailing the file never sees half a record
            # from us (lines are far below PIPE_BUF).
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, separators=(",", ":")) + "\n")
        return line

    def progress(self, *, step: int, max_steps: int | None, loss: float | None, steps_per_s: float,
                 samples_per_s: float, **extra: Any) -> None:
        if not self.enabled:
            return
        self.emit({"type": TrainingProgress.TYPE, "step": step, "max_steps": max_steps, "loss": loss,
                   "steps_per_s": steps_per_s, "samples_per_s": samples_per_s, **extra})
        total = f"/{max_steps}" if max_steps else ""
        loss_txt = f"{loss:.4f}" if loss is not None and math.isfinite(loss) else "n/a"
        log.info("step %d%s  loss %s  %.2f steps/s  %.1f samples/s", step, total, loss_txt, steps_per_s,
                 samples_per_s)

    def metrics(self, *, step: int | None, metrics: dict[str, Any], **extra: Any) -> None:
        """The job's own named metrics (say val_acc) at `step`: a progress record with only them. A name that is
        no short identifier (or a built-in's, like loss) and a value that is no finite number are dropped here,
        with a warning; the console drops them too."""
        if not self.enabled:
            return
        kept, dropped = clean_metrics({k: _clean(v) for k, v in metrics.items()})
        if dropped:
            log.warning("%d of the metrics reported at step %s are dropped: names are identifiers of at most 64 "
                        "characters (not loss, steps_per_s, samples_per_s), values finite numbers", dropped, step)
        if kept:
            self.emit({"type": TrainingProgress.TYPE, **({} if step is None else {"step": step}), "metrics": kept,
                       **extra})

    def checkpoint(self, *, path: Path | str, step: int, **extra: Any) -> None:
        if not self.enabled:
            return
        self.emit({**CheckpointRecord(path=str(path), step=step).to_message(), **extra})
        log.info("checkpoint at step %d: %s", step, path)

    def result(self, **metrics: Any) -> None:
        if not self.enabled:
            return
        line = self.emit(ResultRecord(dict(metrics)).to_message())
        log.info("result: %s", json.dumps({k: v for k, v in line.items() if k not in ("type", "ts")}))


def report_metrics(step: int | None = None, **metrics: Any) -> None:
    """The job's own named metrics, from any script the console runs (no session, no torch needed):
    `workers.runtime.report_metrics(step=100, val_acc=0.93)`. Only rank 0 writes; outside a job it only logs."""
    from .env import RuntimeEnv

    env = RuntimeEnv.from_env()
    Reporter(env.progress_file, enabled=env.is_main).metrics(step=step, metrics=metrics)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record in a progress file (helper for tests, benchmarks and local runs)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

