"""Pollux (OSDI'21) workloads -> Muri-format traces that apps/scheduling/trace.py loads (`load_trace(path, "muri")`).

    python benchmarks/traces/pollux/convert.py    # rewrites the pollux-*.csv files next to this script

Input (upstream/, copied from petuum/adaptdl, see PROVENANCE.tsv): the workload files (name, time, application,
num_replicas, batch_size; time in seconds) and placements-excerpt.csv, the rows of each application's measured
throughput profile (simulator/traces/APP/placements.csv: step and all-reduce seconds per iteration by placement and
per-GPU batch) for the placements these jobs get.

A job keeps its requested GPU count and batch size (the non-adaptive baselines of the Pollux paper) and runs its
application's epochs over the application's dataset:

    iterations = epochs x ceil(examples per epoch / effective batch)
    run time   = iterations x seconds per iteration at the job's placement and per-GPU batch

with the batch split of Pollux's simulator (per-GPU batch capped at the largest profiled one, the rest done by
gradient accumulation) and the placement packed onto 4-GPU nodes. Statistical efficiency is taken as perfect (a
batch of B examples advances training by B examples), which Pollux's simulator does not assume: see README.md.
Standard library only.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "upstream"
PROFILE_FILE = UPSTREAM / "placements-excerpt.csv"
NODE_GPUS = 4
# The profiles measure up to 4 nodes; a larger job is charged the 4 full nodes' time (README.md).
MEASURED_NODES = 4
# Upstream folder -> the name prefix of the traces made from it.
LOADS = {
    "workloads": "pollux",
    "workloads-0.5": "pollux-0.5",
    "workloads-1.5": "pollux-1.5",
    "workloads-2.0": "pollux-2.0",
    "workloads-realistic": "pollux-realistic",  # users' own small configurations (mostly one GPU)
}
HEADER = (
    "job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,interval,iteration_time,"
    "resource_time_0,resource_time_1,resource_time_2,priority"
)


@dataclass(frozen=True, slots=True)
class App:
    epochs: int  # max_epochs of simulator/applications.py
    examples: int  # examples per epoch: the first epoch's progress in validation-*.csv x the initial batch
    init_batch: int  # the smallest validated batch size
    max_local: int  # the largest per-GPU batch profiled (yolov3: set to 8 in applications.py)


APPS = {
    "bert": App(epochs=2, examples=88_644, init_batch=12, max_local=12),
    "cifar10": App(epochs=100, examples=50_219, init_batch=128, max_local=1024),
    "deepspeech2": App(epochs=80, examples=7_156, init_batch=20, max_local=80),
    "imagenet": App(epochs=90, examples=1_281_340, init_batch=200, max_local=200),
    "ncf": App(epochs=10, examples=4_971_008, init_batch=256, max_local=32_768),
    "yolov3": App(epochs=50, examples=16_552, init_batch=8, max_local=8),
}

Profile = dict[tuple[str, str], list[tuple[int, float, float]]]


def placement(gpus: int) -> str:
    """Pollux's key of a job packed onto 4-GPU nodes: GPUs per node, rotated to the smallest string (6 -> '24').
    Beyond MEASURED_NODES nodes, the largest measured packed placement."""
    full, rest = divmod(gpus, NODE_GPUS)
    if full + (1 if rest else 0) > MEASURED_NODES:
        return str(NODE_GPUS) * MEASURED_NODES
    return (str(rest) if rest else "") + str(NODE_GPUS) * full


def batch_split(app: App, gpus: int, batch: int) -> tuple[int, int]:
    """(per-GPU batch, accumulation steps) for a fixed total batch, as Pollux's simulator splits it."""
    local = math.ceil(batch / gpus)
    accumulation = math.ceil(local / app.max_local) - 1
    if gpus == 1 and batch > app.init_batch:
        accumulation = max(1, accumulation)
    return math.ceil(local / (accumulation + 1)), accumulation


def load_profile(path: Path = PROFILE_FILE) -> Profile:
    profile: Profile = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            key = (row["application"], row["placement"])
            profile.setdefault(key, []).append(
                (int(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"]))
            )
    for points in profile.values():
        points.sort()
    return profile


def step_times(points: list[tuple[int, float, float]], local: int) -> tuple[float, float]:
    """(step, all-reduce) seconds at a per-GPU batch: linear between the profiled batches, clamped at the ends."""
    if local <= points[0][0]:
        return points[0][1], points[0][2]
    for (b0, s0, y0), (b1, s1, y1) in zip(points, points[1:], strict=False):
        if local <= b1:
            f = (local - b0) / (b1 - b0)
            return s0 + f * (s1 - s0), y0 + f * (y1 - y0)
    return points[-1][1], points[-1][2]


def iteration_plan(profile: Profile, application: str, gpus: int, batch: int) -> tuple[int, float]:
    """(iterations, seconds per iteration) of a job that keeps `gpus` GPUs and a total batch of `batch`."""
    app = APPS[application]
    local, accumulation = batch_split(app, gpus, batch)
    key = (application, placement(gpus))
    if key not in profile:
        raise KeyError(f"no profile rows for {application} on placement {key[1]} ({gpus} GPUs)")
    step, sync = step_times(profile[key], local)
    seconds = step + accumulation * (step - sync)  # accumulation steps skip the all-reduce
    effective = gpus * local * (accumulation + 1)
    return app.epochs * math.ceil(app.examples / effective), seconds


def convert(workload: Path, profile: Profile) -> list[str]:
    """The workload's jobs as Muri trace rows (times in ms), in submission order."""
    with open(workload, newline="") as handle:
        rows = sorted(
            csv.DictReader(handle), key=lambda r: (int(r["time"]), int(r["name"].rsplit("-", 1)[1]))
        )
    lines = [HEADER]
    for job_id, row in enumerate(rows):
        gpus, batch = int(row["num_replicas"]), int(row["batch_size"])
        iterations, seconds = iteration_plan(profile, row["application"], gpus, batch)
        step_ms = round(1000 * seconds, 3)
        duration_ms = round(iterations * step_ms)
        lines.append(
            f"{job_id},{gpus},{int(row['time']) * 1000},{iterations},{row['application']},{batch},{duration_ms},"
            f"0,{step_ms:.3f},,,,0"
        )
    return lines


def main() -> None:
    profile = load_profile()
    for folder, prefix in LOADS.items():
        for workload in sorted((UPSTREAM / folder).glob("workload-*.csv")):
            number = workload.stem.removeprefix("workload-")
            out = HERE / f"{prefix}-w{number}.csv"
            out.write_text("\n".join(convert(workload, profile)) + "\n")
            print(f"{out.name}: from {folder}/{workload.name}")


if __name__ == "__main__":
    main()
