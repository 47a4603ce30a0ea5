"""Plain-text rendering: tables, a job's detail, its state changes. `--json` output bypasses all of this."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def out(text: str = "") -> None:
    print(text, file=sys.stdout, flush=True)


def err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    out(json.dumps(data, indent=2, sort_keys=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)).rstrip()
        for row in cells
    )


def shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def when(value: str | None) -> str:
    """An API timestamp as `2026-11-30 08:29:41 UTC`."""
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def gpus_text(job: dict[str, Any]) -> str:
    count = job.get("gpus")
    kind = job.get("gpu_type")
    return f"{count} x {kind}" if kind else f"{count}"


def allocations_text(allocations: list[dict[str, Any]] | None) -> str:
    """`node-a:0,1 node-b:3 (H200)` from the job's `allocations`."""
    if not allocations:
        return ""
    by_host: dict[str, list[str]] = {}
    types: list[str] = []
    for allocation in allocations:
        by_host.setdefault(str(allocation.get("host")), []).append(str(allocation.get("index")))
        gpu_type = allocation.get("gpu_type")
        if gpu_type and gpu_type not in types:
            types.append(gpu_type)
    placed = " ".join(f"{host}:{','.join(indexes)}" for host, indexes in by_host.items())
    return f"{placed} ({', '.join(types)})" if types else placed


def workload_text(workload: Any) -> str:
    if not isinstance(workload, dict):
        return json.dumps(workload)
    if "builtin" in workload:
        params = workload.get("params") or {}
        extra = " " + " ".join(f"{k}={json.dumps(v)}" for k, v in params.items()) if params else ""
        return f"builtin {workload['builtin']}{extra}"
    if "command" in workload:
        return "command " + shlex.join(str(arg) for arg in workload["command"])
    return json.dumps(workload)


def progress_text(job: dict[str, Any]) -> str:
    parts = []
    steps, limit = job.get("steps_done"), job.get("max_steps")
    if steps or limit:
        parts.append(f"{steps or 0} steps" + (f" of {limit}" if limit else ""))
    if job.get("steps_per_second") is not None:
        parts.append(f"{job['steps_per_second']:.3g} steps/s")
    if job.get("samples_per_second") is not None:
        parts.append(f"{job['samples_per_second']:.3g} samples/s")
    if job.get("last_loss") is not None:
        parts.append(f"loss {job['last_loss']:.4g}")
    return ", ".join(parts)


def state_note(job: dict[str, Any]) -> str:
    """What to say next to a state: why it waits, where it runs, how it ended."""
    state = job.get("state")
    if state in ("queued", "preempted"):
        note = job.get("pending_reason") or ""
        if job.get("queue_position"):
            note += f" (position {job['queue_position']}" + (
                f", estimated start {when(job.get('estimated_start'))})" if job.get("estimated_start") else ")"
            )
        return note.strip()
    if state in ("placed", "running"):
        return allocations_text(job.get("allocations"))
    if state == "failed":
        code = job.get("exit_code")
        reason = job.get("failure_reason") or ""
        if code is None:
            return reason
        return f"exit code {code}" + (f": {reason}" if reason and reason != f"exited with code {code}" else "")
    if state == "succeeded":
        return "exit code 0" if job.get("exit_code") in (0, None) else f"exit code {job['exit_code']}"
    return ""


def job_rows(jobs: list[dict[str, Any]]) -> str:
    rows = [
        [job.get("id"), shorten(task_name(job), 28), job.get("team"), job.get("user"), job.get("kind"),
         gpus_text(job), job.get("state"), shorten(_list_note(job), 60)]
        for job in jobs
    ]
    return table(["ID", "NAME", "TEAM", "USER", "KIND", "GPUS", "STATE", "INFO"], rows)


def _list_note(job: dict[str, Any]) -> str:
    note = state_note(job)
    if job.get("state") == "running" and job.get("steps_per_second") is not None:
        note = f"{note}, {job['steps_per_second']:.3g} steps/s" if note else f"{job['steps_per_second']:.3g} steps/s"
    return note


def code_text(code: Any) -> str | None:
    """`snapshot 3f2c...` or `https://git.example.org/a/b.git @ 1a2b3c4 (main)` from a job's `code`."""
    if not isinstance(code, dict) or not code:
        return None
    snapshot = code.get("snapshot")
    if snapshot:
        ident = snapshot.get("id") if isinstance(snapshot, dict) else snapshot
        return f"snapshot {ident}"
    git = code.get("git")
    if isinstance(git, dict) and git.get("url"):
        commit = git.get("commit")
        ref = git.get("ref")
        text = str(git["url"])
        if commit:
            text += f" @ {str(commit)[:12]}" + (f" ({ref})" if ref else "")
        elif ref:
            text += f" @ {ref}"
        return text
    return json.dumps(code, sort_keys=True)


def task_name(job: dict[str, Any]) -> str:
    """The job's name, with its index for a task of a job array (`sweep[3]`)."""
    name = str(job.get("name") or "")
    return f"{name}[{job['array_index']}]" if job.get("array_index") is not None else name


def job_detail(job: dict[str, Any]) -> str:
    lines = [f"Job {job.get('id')}: {task_name(job)}  (team {job.get('team')}, user {job.get('user')})"]

    def add(label: str, value: Any) -> None:
        if value not in (None, ""):
            lines.append(f"  {label + ':':<14}{value}")

    add("state", job.get("state"))
    if job.get("array_id") is not None:
        at_once = f", at most {job['array_parallelism']} at once" if job.get("array_parallelism") else ""
        add("array", f"task {job.get('array_index')} of {job.get('array_size')} in job array {job['array_id']}"
                     + at_once)
    if job.get("state") in ("queued", "preempted"):
        add("pending", job.get("pending_reason"))
        add("queue", f"position {job['queue_position']}" if job.get("queue_position") else None)
        add("est. start", when(job.get("estimated_start")) if job.get("estimated_start") else None)
    add("request", f"{job.get('kind')}, {gpus_text(job)} GPU(s), priority {job.get('priority')}, "
                   f"preset {job.get('preset')}")
    add("workload", workload_text(job.get("workload")))
    resolved = job.get("resolved_image")
    add("image", (job.get("image") or "") + (f" (ran {resolved})" if resolved and resolved != job.get("image") else ""))
    add("backend", job.get("backend"))
    add("code", code_text(job.get("code")))
    for key in ("env", "secrets", "mounts"):  # env: the names only, as for secrets
        names = job.get(key)
        add(key, ", ".join(sorted(str(n) for n in names)) if isinstance(names, dict | list) and names else None)
    add("gpus", allocations_text(job.get("allocations")))
    add("progress", progress_text(job))
    believed = job.get("believed_steps")
    if isinstance(believed, dict) and job.get("max_steps"):
        than = "fewer" if believed.get("steps", 0) < job["max_steps"] else "more"
        runs = believed.get("runs")
        add("max steps", f"{job['max_steps']} (the scheduler counts on about {believed.get('steps')}: "
                         f"{job.get('user')}'s last {runs} finished run{'s' if runs != 1 else ''} with max steps "
                         f"ran {than} steps than they declared)")
    if job.get("exit_code") is not None or job.get("state") in ("succeeded", "failed"):
        add("exit code", job.get("exit_code") if job.get("exit_code") is not None else "-")
    add("failure", job.get("failure_reason"))
    add("attempts", job.get("attempts") if (job.get("attempts") or 0) > 1 else None)
    add("preemptions", job.get("preemption_count") or None)
    add("limits", f"{job.get('time_limit_minutes')} min, {job.get('max_retries')} retries")
    add("created", when(job.get("created_at")))
    add("started", when(job.get("started_at")) if job.get("started_at") else None)
    add("finished", when(job.get("finished_at")) if job.get("finished_at") else None)
    return "\n".join(lines)
