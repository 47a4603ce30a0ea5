"""The simulator with shared GPUs: the interference model by hand, and fractions never starving a whole job."""

from dataclasses import replace

import pytest

import apps.scheduling.simulate as simulate_module
from apps.scheduling.config import PolicyConfig
from apps.scheduling.interference import round_s, slowdowns
from apps.scheduling.policy import schedule
from apps.scheduling.simulate import simulate
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import TraceJob, build_hosts
from apps.scheduling.types import Snapshot, TeamQuotaView

CPU_BOUND = (0.8, (0.706, 0.059, 0.0))  # shufflenet-like: data loading dominates
GPU_BOUND = (0.178, (0.0005, 0.16, 0.0))  # bert-like: GPU compute dominates
MIXED = (1.0, (0.6, 0.3))


def test_interference_model_by_hand():
    # Alone: no slowdown. Two MIXED jobs: the first resource needs 1.2 s per joint round > 1.0 s iteration.
    assert slowdowns([MIXED]) == [1.0]
    assert round_s([MIXED, MIXED]) == pytest.approx(1.2)
    assert slowdowns([MIXED, MIXED]) == pytest.approx([1.2, 1.2])
    # Complementary resources but very different iteration times: the round is the longer iteration (0.8 s),
    # so the CPU-bound job runs at full speed and the short GPU-bound one waits for it (0.8 / 0.178 = 4.49x).
    assert slowdowns([CPU_BOUND, GPU_BOUND]) == pytest.approx([1.0, 0.8 / 0.178])
    # Plain time slicing for jobs without resource times: three 1 s jobs take 3 s per round.
    assert slowdowns([(1.0, (1.0,))] * 3) == pytest.approx([3.0] * 3)
    assert round_s([MIXED, MIXED], switch_overhead=0.1) == pytest.approx(1.32)


def mixed_job(job_id: int, duration: float, submit: float = 0.0, gpus: int = 1, team: str = "default") -> TraceJob:
    return TraceJob(
        job_id, gpus, submit, duration, "m", iterations=int(duration), step_s=1.0, resource_s=MIXED[1], team=team
    )


def halves(snapshot: Snapshot):
    pending = tuple(replace(j, gpu_share=0.5) if j.gpus == 1 else j for j in snapshot.pending)
    return schedule(replace(snapshot, pending=pending), PolicyConfig())


def run(jobs, hosts=1, per_host=1, decide=halves, quotas=None):
    quotas = quotas or {"default": TeamQuotaView("default", hosts * per_host)}
    sim = Simulator(jobs, build_hosts(hosts, per_host), decide, quotas)
    return sim, sim.run("test")


def test_two_jobs_sharing_one_gpu_by_hand():
    # Both share GPU 0 from t=0 at 1.2x: B (50 s of work) ends at 60; A has done 50 s of its 100 by then and
    # finishes the other 50 alone at 110. Whole, one after the other (equal predictions: job 0 first): 100, 150.
    sim, result = run([mixed_job(0, 100.0), mixed_job(1, 50.0)])
    finish = {s.trace.job_id: s.finish for s in result.jobs}
    assert finish[1] == pytest.approx(60.0) and finish[0] == pytest.approx(110.0)
    # GPU-seconds count the share: 0.5 x 60 + 0.5 x 110.
    assert result.busy_gpu_s == pytest.approx(85.0)
    whole = run([mixed_job(0, 100.0), mixed_job(1, 50.0)], decide=lambda s: schedule(s, PolicyConfig()))[1]
    assert sorted(s.finish for s in whole.jobs) == pytest.approx([100.0, 150.0])


def test_a_third_job_joins_and_retimes_the_others():
    # 0 and 1 share the only GPU from 0 (1.2x, both end at 120); 2 arrives at 12, finds no room, runs 120-130.
    sim, result = run([mixed_job(0, 100.0), mixed_job(1, 100.0), mixed_job(2, 10.0, submit=12.0)])
    finish = {s.trace.job_id: s.finish for s in result.jobs}
    assert finish[0] == pytest.approx(120.0) and finish[1] == pytest.approx(120.0)
    assert finish[2] == pytest.approx(130.0)


def test_fractions_never_block_a_whole_gpu_job_forever():
    # One host of 2 GPUs. Quarter-GPU jobs of team f arrive every 10 s for 2,000 s, each 100 s of work
    # (time-sliced: up to 4x slower when four share a GPU), more than the GPUs can serve. A 2-GPU job of team w
    # arrives at 35 s, when three quarters share GPU 0. The quarters are ordered first (shorter), so without the
    # fence they keep both GPUs partly used until the stream has drained (it would start after 10,000 s); with
    # it no new quarter is placed on its GPUs and it starts once those running end: within 35 + 4 x 100 s.
    stream = [
        TraceJob(i, 1, 10.0 * i, 100.0, "q", iterations=100, step_s=1.0, team="f") for i in range(1, 200)
    ]
    wide = TraceJob(1000, 2, 35.0, 50.0, "w", iterations=50, step_s=1.0, team="w")
    quotas = {"f": TeamQuotaView("f", 2), "w": TeamQuotaView("w", 2)}

    def quarters(snapshot: Snapshot):
        pending = tuple(replace(j, gpu_share=0.25) if j.team == "f" else j for j in snapshot.pending)
        return schedule(replace(snapshot, pending=pending), PolicyConfig())

    sim, result = run([*stream, wide], hosts=1, per_host=2, decide=quarters, quotas=quotas)
    start = next(s.first_start for s in result.jobs if s.trace.job_id == 1000)
    assert start is not None and start <= 35.0 + 400.0
    assert all(s.finish is not None for s in result.jobs)


def test_console_share_policy_runs_and_shares(monkeypatch):
    # The jobs here run a minute or two: the console measures them at once (not after MEASURE_S).
    monkeypatch.setattr(simulate_module, "MEASURE_S", 0.0)
    jobs = [mixed_job(i, 50.0 + 10 * i, submit=float(i)) for i in range(8)] + [mixed_job(50, 100.0, 0.0, 2)]
    whole = simulate(jobs, "1x2", "console")
    shared = simulate(jobs, "1x2", "console-share")
    assert shared.jobs == whole.jobs == 9
    assert 0 < shared.gpu_utilization <= 1
    assert shared.avg_jct_h != whole.avg_jct_h  # sharing changed the schedule
