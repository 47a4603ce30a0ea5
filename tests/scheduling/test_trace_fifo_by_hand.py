"""FIFO on the 60-job Tiresias trace (16 hosts x 4 GPUs), checked against figures worked out by hand.

Reasoning: at any instant the running jobs ask for at most 26 GPUs (the peak, around t = 1,450 s, when jobs
40-50 overlap with long job 49), and a gang of 8 needs two empty 4-GPU hosts; best-fit placement packs the
single-host jobs, so with 64 GPUs there are always two empty hosts left. So no job ever queues: each starts when
it is submitted and finishes `duration` seconds later, and the average JCT is the mean duration,
10,705 s / 60 = 178.4167 s. For example job 0 (1 GPU, submitted at 0, 164 s) runs 0-164; job 1 (8 GPUs, 30,
147 s) runs 30-177; job 34 (8 GPUs, 1,008, 305 s) runs 1,008-1,313; job 49 (1 GPU, 1,471, 1,800 s) runs
1,471-3,271, the last to finish, so the makespan is 3,271 s.

On a 2 x 4 cluster the same FIFO (no reservation) must queue. By hand: job 0 takes a GPU of host 0 at 0; job 1
(8 GPUs) needs both hosts empty and waits; job 2 (2 GPUs, t=53) best-fits onto host 0; job 3 (1 GPU, t=79) onto
host 0, which is now full; job 4 (4 GPUs, t=99) takes host 1 until 220. Job 1 cannot start before both hosts
are empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.scheduling.config import PolicyConfig
from apps.scheduling.metrics import summarize
from apps.scheduling.policy import schedule
from apps.scheduling.simulate import team_quotas
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import build_hosts, load_trace

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "tiresias" / "60_job.csv"

pytestmark = pytest.mark.skipif(not TRACE.exists(), reason="shared traces not present")


def run_fifo(num_hosts: int, per_host: int):
    jobs = load_trace(TRACE, "tiresias")
    hosts = build_hosts(num_hosts, per_host)
    config = PolicyConfig(policy="fifo")
    sim = Simulator(jobs, hosts, lambda s: schedule(s, config), team_quotas(jobs, num_hosts * per_host))
    result = sim.run("fifo")
    return {s.trace.job_id: s for s in result.jobs}, result


def test_sixty_jobs_on_sixteen_by_four_never_queue():
    states, result = run_fifo(16, 4)
    for job_id, start, finish in [(0, 0, 164), (1, 30, 177), (34, 1008, 1313), (49, 1471, 3271)]:
        assert states[job_id].first_start == start
        assert states[job_id].finish == finish
    summary = summarize(result)
    assert summary.avg_jct_h * 3600 == pytest.approx(10_705 / 60)
    assert summary.makespan_h * 3600 == pytest.approx(3271)
    assert summary.preemptions == 0


def test_first_jobs_on_two_by_four_by_hand():
    states, _ = run_fifo(2, 4)
    assert (states[0].first_start, states[0].finish) == (0, 164)
    assert (states[2].first_start, states[2].finish) == (53, 180)
    assert (states[3].first_start, states[3].finish) == (79, 200)
    assert (states[4].first_start, states[4].finish) == (99, 220)
    # job 1 waits for an empty cluster: not before the last of jobs 0, 2, 3, 4 ends
    assert states[1].first_start >= 220
