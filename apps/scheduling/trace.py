"""Reading job traces (Muri / Philly-derived and Tiresias formats) and cluster shapes for the simulator."""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from apps.scheduling.types import GpuView, HostView, Priority

# The published Muri simulator runs each job for iterations x iteration_time, slowed by 1.5%.
MURI_ITERATION_SLOWDOWN = 1.015
RUNTIME_MODELS = ("duration", "muri")
# What jobs declare (their steps) to the console, beside the truth the simulator enforces: "trace" as the file says
# (a `declared_iterations` column, empty meaning nothing declared; without the column every job declares its true
# iterations), "exact", "noisy" (true iterations times a seeded lognormal factor, sigma NOISY_SIGMA), "partial"
# (a seeded PARTIAL_UNDECLARED share of jobs declares nothing, the others exactly), "none".
DECLARATION_MODES = ("trace", "exact", "noisy", "partial", "none", "biased")
NOISY_SIGMA = 1.0
# "biased": the jobs spread over users (job id modulo their number), each declaring steps off by a factor of their
# own (those of HPC users' time limits run 2-5x) times a lognormal factor of spread BIASED_SIGMA.
USER_BIASES = (0.5, 1.0, 2.0, 4.0)
BIASED_SIGMA = 0.5
DECLARES_TRUTH = -1
PARTIAL_UNDECLARED = 0.3


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: int
    gpus: int
    submit_s: float
    # The true run time the simulator enforces; only oracle policies may read it.
    duration_s: float
    model: str
    iterations: int | None = None
    # Step time a running job reports (what the console may observe once the job has started).
    step_s: float | None = None
    team: str = "default"
    user: str = "user"
    priority: Priority = Priority.NORMAL
    # Seconds per iteration on each resource (Muri's resource_time_0..2), for the interference model.
    resource_s: tuple[float, ...] | None = None
    # The steps the job declares to the console (None: nothing declared; DECLARES_TRUTH: its true iterations).
    declared_iterations: int | None = -1

    @property
    def declared_steps(self) -> int | None:
        return self.iterations if self.declared_iterations == DECLARES_TRUTH else self.declared_iterations

    @property
    def workload(self) -> dict[str, str]:
        """The job as the console would record it: a named model runs like a built-in (similarity.py)."""
        return {"builtin": self.model}


def load_trace(path: str | Path, trace_format: str, runtime_model: str = "duration") -> list[TraceJob]:
    """`duration`: run time is the trace's duration column. `muri`: iterations x iteration_time x 1.015, the
    model of the published Muri simulator (used to reproduce its figures)."""
    if runtime_model not in RUNTIME_MODELS:
        raise ValueError(f"unknown runtime model {runtime_model!r}")
    scale = {"muri": 1000.0, "tiresias": 1.0}.get(trace_format)
    if scale is None:
        raise ValueError(f"unknown trace format {trace_format!r}; expected muri or tiresias")
    jobs = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            iterations = int(row["iterations"]) if row.get("iterations") else None
            if "declared_iterations" in row:
                declared = row["declared_iterations"].strip() if row["declared_iterations"] else ""
                declared_iterations = int(float(declared)) if declared else None
            else:
                declared_iterations = iterations
            duration = float(row["duration"]) / scale
            if row.get("iteration_time"):
                step = float(row["iteration_time"]) / scale
            elif iterations:
                step = duration / iterations
            else:
                step = None
            if runtime_model == "muri" and iterations and step:
                step *= MURI_ITERATION_SLOWDOWN
                duration = iterations * step
            resources = tuple(
                float(row[f"resource_time_{k}"]) / scale for k in range(3) if row.get(f"resource_time_{k}")
            )
            priority = (
                Priority.from_name(row["priority_class"]) if row.get("priority_class") else Priority.NORMAL
            )
            jobs.append(
                TraceJob(
                    job_id=int(row["job_id"]),
                    gpus=int(row["num_gpu"]),
                    submit_s=float(row["submit_time"]) / scale,
                    duration_s=duration,
                    model=row.get("model_name") or "unknown",
                    iterations=iterations,
                    step_s=step,
                    team=row.get("team") or "default",
                    user=row.get("user") or "user",
                    priority=priority,
                    resource_s=resources or None,
                    declared_iterations=declared_iterations,
                )
            )
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return jobs


def with_declarations(jobs: list[TraceJob], mode: str, seed: int = 0) -> list[TraceJob]:
    """The jobs with what they declare under `mode` (DECLARATION_MODES); seeded, so a run is repeatable."""
    if mode not in DECLARATION_MODES:
        raise ValueError(f"unknown declaration mode {mode!r}; expected one of {', '.join(DECLARATION_MODES)}")
    if mode == "trace":
        return jobs
    rng = random.Random(seed)
    declared: list[TraceJob] = []
    for job in jobs:
        # one draw per job whatever the mode, so jobs get the same factor in every run of a seed
        factor = math.exp(rng.gauss(0.0, NOISY_SIGMA))
        undeclared = rng.random() < PARTIAL_UNDECLARED
        value: int | None = job.iterations
        user = job.user
        if mode == "none" or (mode == "partial" and undeclared) or value is None:
            value = None
        elif mode == "noisy":
            value = max(1, round(value * factor))
        elif mode == "biased":
            number = job.job_id % len(USER_BIASES)
            user = f"user{number}"
            value = max(1, round(value * USER_BIASES[number] * factor ** (BIASED_SIGMA / NOISY_SIGMA)))
        declared.append(replace(job, user=user, declared_iterations=value))
    return declared


def with_load(jobs: list[TraceJob], factor: float) -> list[TraceJob]:
    """The jobs with every gap between submissions divided by `factor` (2: arrivals twice as dense, twice the
    offered load; 0.5: half). The first submission and each job's work are unchanged."""
    if factor <= 0:
        raise ValueError(f"load factor must be positive, not {factor!r}")
    if factor == 1 or not jobs:
        return jobs
    start = min(job.submit_s for job in jobs)
    return [replace(job, submit_s=start + (job.submit_s - start) / factor) for job in jobs]


def all_submitted_at_start(jobs: list[TraceJob]) -> list[TraceJob]:
    """The jobs all submitted at the first submission time: Muri's `*_pr` traces are their base trace so."""
    if not jobs:
        return jobs
    start = min(job.submit_s for job in jobs)
    return [replace(job, submit_s=start) for job in jobs]


def parse_cluster(spec: str) -> tuple[int, int]:
    """'8x8' -> (8 hosts, 8 GPUs each)."""
    hosts, _, per_host = spec.lower().partition("x")
    if not hosts.isdigit() or not per_host.isdigit():
        raise ValueError(f"cluster must look like HOSTSxGPUS (e.g. 8x8), not {spec!r}")
    return int(hosts), int(per_host)


def build_hosts(num_hosts: int, gpus_per_host: int, gpu_type: str = "gpu") -> tuple[HostView, ...]:
    return tuple(
        HostView(
            f"node{h:03d}",
            tuple(GpuView(h * gpus_per_host + i, i, gpu_type) for i in range(gpus_per_host)),
        )
        for h in range(num_hosts)
    )
