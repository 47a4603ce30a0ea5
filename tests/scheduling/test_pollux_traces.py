"""The Pollux workloads as Muri-format traces: benchmarks/traces/pollux/convert.py and how the benchmark runs them."""

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from apps.scheduling.trace import load_trace
from benchmarks.scheduler import expand_traces, load_named_trace, trace_setup

POLLUX = Path(__file__).resolve().parents[2] / "benchmarks" / "traces" / "pollux"


def _convert_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pollux_convert", POLLUX / "convert.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


convert = _convert_module()


@pytest.mark.parametrize(
    ("gpus", "key"),
    [
        (1, "1"),
        (2, "2"),
        (4, "4"),
        (6, "24"),
        (8, "44"),
        (12, "444"),
        (16, "4444"),
        (24, "4444"),
        (48, "4444"),
    ],
)
def test_a_job_is_packed_onto_4_gpu_nodes_and_keyed_as_pollux_rotates_it(gpus: int, key: str) -> None:
    assert convert.placement(gpus) == key


@pytest.mark.parametrize(
    ("app", "gpus", "batch", "split"),
    [
        ("cifar10", 6, 2048, (342, 0)),
        ("bert", 6, 384, (11, 5)),  # per-GPU 64 over a profiled maximum of 12: 6 micro-batches of 11
        ("yolov3", 4, 64, (8, 1)),
        ("ncf", 1, 32768, (16384, 1)),  # one GPU above the initial batch: at least one accumulation step
    ],
)
def test_a_fixed_batch_is_split_into_per_gpu_batches_and_accumulation(
    app: str, gpus: int, batch: int, split: tuple[int, int]
) -> None:
    assert convert.batch_split(convert.APPS[app], gpus, batch) == split


def test_step_times_are_linear_between_profiled_batches_and_clamped_outside() -> None:
    points = [(100, 1.0, 0.2), (200, 2.0, 0.4)]
    assert convert.step_times(points, 150) == pytest.approx((1.5, 0.3))
    assert convert.step_times(points, 50) == (1.0, 0.2)
    assert convert.step_times(points, 300) == (2.0, 0.4)


def test_run_time_is_epochs_over_the_dataset_at_the_measured_iteration_time() -> None:
    profile = {("yolov3", "4"): [(4, 0.4, 0.1), (8, 0.5, 0.1), (16, 0.8, 0.1)]}
    iterations, seconds = convert.iteration_plan(profile, "yolov3", 4, 64)
    app = convert.APPS["yolov3"]
    assert iterations == app.epochs * math.ceil(app.examples / 64)
    assert seconds == pytest.approx(0.5 + 1 * (0.5 - 0.1))  # one accumulation step skips the all-reduce
    with pytest.raises(KeyError):
        convert.iteration_plan(profile, "yolov3", 8, 64)


def test_the_stored_traces_are_what_the_converter_makes_of_the_stored_workloads() -> None:
    profile = convert.load_profile()
    made = 0
    for folder, prefix in convert.LOADS.items():
        for workload in sorted((convert.UPSTREAM / folder).glob("workload-*.csv")):
            trace = POLLUX / f"{prefix}-w{workload.stem.removeprefix('workload-')}.csv"
            assert trace.read_text() == "\n".join(convert.convert(workload, profile)) + "\n", trace.name
            made += 1
    assert made >= 8


def test_a_pollux_trace_loads_in_submission_order_with_duration_iterations_times_step() -> None:
    jobs = load_trace(POLLUX / "pollux-w1.csv", "muri")
    assert len(jobs) == 160
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    assert {j.model for j in jobs} == set(convert.APPS)
    for job in jobs:
        assert job.iterations and job.step_s
        assert job.duration_s == pytest.approx(job.iterations * job.step_s, abs=1e-3)
        assert 1 <= job.gpus <= 64


def test_the_benchmark_runs_pollux_traces_on_16x4_for_their_duration() -> None:
    assert trace_setup("pollux-w3", "muri") == ("16x4", "duration")
    assert trace_setup("trace2", "muri") == ("8x8", "muri")
    names = expand_traces(["pollux"])
    assert names[:8] == [f"pollux-w{k}" for k in range(1, 9)]
    assert "pollux-2.0-w1" in names
    jobs = load_named_trace(Path("/nonexistent"), "pollux-w1", "muri")
    assert jobs[0].duration_s == pytest.approx(671.942)  # no Muri slowdown
