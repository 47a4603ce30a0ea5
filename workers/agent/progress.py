"""Which of a job's new progress records the agent forwards: every training record (thinned evenly past
MAX_PROGRESS_BATCH, keeping those that carry the job's own metrics first and always the newest) and the newest
serving record."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workers.protocol import MAX_PROGRESS_BATCH, ProgressRecord, ServingProgress, TrainingProgress


def evenly(items: Sequence[int], limit: int) -> list[int]:
    """At most `limit` of `items`, evenly spread, the last one always among them."""
    if len(items) <= limit:
        return list(items)
    if limit <= 1:
        return list(items[-1:])
    gap = (len(items) - 1) / (limit - 1)
    return [items[round(i * gap)] for i in range(limit)]


def forwarded(records: Iterable[ProgressRecord], limit: int = MAX_PROGRESS_BATCH,
              ) -> tuple[list[TrainingProgress], ServingProgress | None]:
    """The training records to send (in file order, at most `limit`) and the newest serving record."""
    training: list[TrainingProgress] = []
    serving: ServingProgress | None = None
    for record in records:
        if isinstance(record, TrainingProgress):
            training.append(record)
        elif isinstance(record, ServingProgress):
            serving = record
    if len(training) <= limit:
        return training, serving
    # A job may report its loss every step and its validation accuracy every thousand: thinning all records
    # alike would lose the rare ones, so those with named metrics get up to half the room first.
    own = evenly([i for i, r in enumerate(training) if r.metrics], limit // 2)
    rest = evenly([i for i, r in enumerate(training) if not r.metrics], limit - len(own))
    keep = sorted({*own, *rest, len(training) - 1})[-limit:]
    return [training[i] for i in keep], serving
