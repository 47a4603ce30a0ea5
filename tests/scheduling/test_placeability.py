"""placement_refusal: the check a placement makes when it happens, in the console and in the simulator."""

from __future__ import annotations

import pytest

from apps.scheduling.placeability import Candidate, candidates, gpu_index, placement_refusal, units_in_use
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import TraceJob, build_hosts
from apps.scheduling.types import Decisions, GpuView, HostView, Placement, Snapshot, TeamQuotaView
from tests.scheduling.helpers import pending, running


def gpu(gpu_id: int = 0, gpu_type: str = "a100", memory_mb: int = 80_000, schedulable: bool = True) -> GpuView:
    return GpuView(gpu_id, gpu_id, gpu_type, schedulable, memory_mb)


def test_a_free_gpu_takes_a_whole_job_or_a_fraction():
    assert placement_refusal(pending(1), [Candidate(gpu())], 100) is None
    assert placement_refusal(pending(1, gpu_share=0.25), [Candidate(gpu(), units_in_use=75)], 25) is None


@pytest.mark.parametrize(
    ("job", "offered", "units", "why"),
    [
        (pending(1, gpus=2), [Candidate(gpu(0))], 100, "needs 2 distinct GPUs"),
        (pending(1, gpus=2), [Candidate(gpu(0)), Candidate(gpu(0))], 100, "needs 2 distinct GPUs"),
        (pending(1), [Candidate(gpu(), host="h1", host_schedulable=False)], 100, "GPU h1:0: its host takes no new"),
        (pending(1), [Candidate(gpu(schedulable=False))], 100, "GPU 0 takes no new jobs"),
        (pending(1, gpu_type="h200"), [Candidate(gpu())], 100, "is a a100, not a h200"),
        (pending(1), [Candidate(gpu(), units_in_use=25)], 100, "has 0.75 of a GPU free, not 1"),
        (pending(1, gpu_share=0.5), [Candidate(gpu(), units_in_use=75)], 50, "has 0.25 of a GPU free, not 0.5"),
        (pending(1, gpu_share=0.5), [Candidate(gpu())], 0, "not between 1 and 100"),
        (pending(1), [Candidate(gpu())], 50, "only a 1-GPU job may take part of a GPU"),
        (pending(1, gpu_memory_mb=100_000), [Candidate(gpu())], 100, "has 80000 MB of memory, not 100000 MB"),
        # 40 GB of an 80 GB GPU is half of it: a quarter share is too little there.
        (pending(1, gpu_share=0.25, gpu_memory_mb=40_000), [Candidate(gpu())], 25, "needs 0.5 of a GPU"),
        # A GPU of unknown memory can hold a memory-only job only whole.
        (pending(1, gpu_memory_mb=1_000), [Candidate(gpu(memory_mb=0))], 50, "needs 1 of a GPU"),
    ],
)
def test_refusals_say_why(job, offered, units, why):
    refusal = placement_refusal(job, offered, units)
    assert refusal is not None and why in refusal


def test_memory_within_the_share_is_placeable():
    assert placement_refusal(pending(1, gpu_memory_mb=40_000), [Candidate(gpu())], 50) is None
    assert placement_refusal(pending(1, gpu_memory_mb=1_000), [Candidate(gpu(memory_mb=0))], 100) is None


def test_units_in_use_and_candidates():
    quarter = running(1, (0,), gpu_share=0.25)
    gang = running(2, (1, 2))
    assert units_in_use([quarter, gang, running(3, (0,), gpu_share=0.5)]) == {0: 75, 1: 100, 2: 100}
    host = HostView("h", (gpu(0), gpu(1)), schedulable=False)
    index = gpu_index([host])
    assert index[1] == (host, gpu(1))
    assert candidates((1, 0), index, {0: 25}) == [Candidate(gpu(1), "h", False, 0, host), Candidate(gpu(0), "h", False, 25, host)]
    assert candidates((0, 9), index, {}) is None


def test_the_simulator_refuses_a_policy_that_double_books_a_gpu():
    jobs = [TraceJob(job_id=i, gpus=1, submit_s=0.0, duration_s=10.0, model="m") for i in (1, 2)]

    def same_gpu(snap: Snapshot) -> Decisions:
        return Decisions(tuple(Placement(p.job_id, (0,), gpu_share=0.75) for p in snap.pending))

    sim = Simulator(jobs, build_hosts(1, 1), same_gpu, {"default": TeamQuotaView("default", 1)})
    with pytest.raises(RuntimeError, match="has 0.25 of a GPU free, not 0.75"):
        sim.run("double-booking")
