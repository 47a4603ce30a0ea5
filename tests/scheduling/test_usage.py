"""The GPU-seconds arithmetic of apps/scheduling/usage.py, and the similarity key."""

from __future__ import annotations

import math

import pytest

from apps.scheduling.baselines import Tiresias2DLAS
from apps.scheduling.config import PolicyConfig
from apps.scheduling.similarity import similarity_key
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import TraceJob, build_hosts
from apps.scheduling.types import Decisions, Placement, Snapshot, TeamQuotaView
from apps.scheduling.usage import (
    attained_gpu_seconds,
    decay,
    decayed_gpu_seconds,
    gpus_held,
    job_share_units,
    segment_gpu_seconds,
    segment_seconds,
)
from tests.scheduling.helpers import hosts, pending, running, snapshot


def test_a_fraction_counts_its_share():
    assert gpus_held(1, 25) == 0.25
    assert gpus_held(4, None) == gpus_held(4, 100) == 4
    assert segment_gpu_seconds(1, 25, 100.0) == 25.0
    assert segment_gpu_seconds(8, None, 10.0) == 80.0
    assert segment_gpu_seconds(2, None, -5.0) == 0.0


@pytest.mark.parametrize(
    ("segment", "expected"),
    [
        ((10.0, 20.0), 10.0),  # inside
        ((-5.0, 20.0), 20.0),  # started before the window
        ((90.0, 150.0), 10.0),  # ends after it
        ((-5.0, 150.0), 100.0),  # covers it
        ((100.0, 150.0), 0.0),  # after
        ((-50.0, 0.0), 0.0),  # before
        ((40.0, None), 60.0),  # still open: runs to the window's end
    ],
)
def test_segment_seconds_clips_to_the_window(segment, expected):
    assert segment_seconds(*segment, 0.0, 100.0) == expected


def test_decayed_usage_is_the_integral_of_the_weight():
    half_life = 3600.0
    # One second that ended one half-life ago weighs about a half.
    assert decayed_gpu_seconds(1, None, 0.0, 1.0, 1.0 + half_life, half_life) == pytest.approx(0.5, rel=1e-3)
    # The closed form, for a quarter GPU over two half-lives up to now.
    rate = math.log(2) / half_life
    expected = 0.25 * (1 - math.exp(-rate * 7200.0)) / rate
    assert decayed_gpu_seconds(1, 25, 0.0, 7200.0, 7200.0, half_life) == pytest.approx(expected)
    # Additive over a split, and a plain count when the half-life is very long.
    whole = decayed_gpu_seconds(2, None, 0.0, 100.0, 500.0, half_life)
    parts = decayed_gpu_seconds(2, None, 0.0, 30.0, 500.0, half_life) + decayed_gpu_seconds(
        2, None, 30.0, 100.0, 500.0, half_life)
    assert parts == pytest.approx(whole)
    assert decayed_gpu_seconds(1, 25, 0.0, 100.0, 100.0, 1e12) == pytest.approx(25.0, rel=1e-9)
    assert decayed_gpu_seconds(1, None, 10.0, 10.0, 20.0, half_life) == 0.0
    assert decayed_gpu_seconds(1, None, 0.0, 10.0, 20.0, 0.0) == 0.0


def test_decay_factor():
    assert decay(3600.0, 3600.0) == 0.5
    assert decay(0.0, 3600.0) == 1.0
    assert decay(10.0, 0.0) == 0.0


def test_attained_service_of_waiting_and_running_jobs():
    assert attained_gpu_seconds(pending(1, attained_gpu_seconds=40.0), now=1000.0) == 40.0
    quarter = running(2, (0,), gpu_share=0.25, started_at=900.0, attained_gpu_seconds=5.0)
    assert attained_gpu_seconds(quarter, now=1000.0) == 5.0 + 25.0
    gang = running(3, (0, 1, 2, 3), started_at=900.0)
    assert attained_gpu_seconds(gang, now=1000.0) == 400.0
    assert job_share_units(quarter) == 25
    assert job_share_units(gang) == 100
    # A share asked for on a gang is ignored: gangs take whole GPUs.
    assert job_share_units(pending(4, gpus=2, gpu_share=0.5)) == 100


def test_tiresias_counts_a_fraction_by_its_share():
    """A quarter GPU reaches the first 2D-LAS threshold (3,250 GPU-s) after 13,000 s, not 3,250 s."""
    policy = Tiresias2DLAS()
    quarter = running(1, (0,), gpu_share=0.25, started_at=0.0)
    decisions = policy.decide(snapshot(hosts(1, 1), running_jobs=[quarter], now=0.0))
    assert decisions.wake_at == pytest.approx(13_000.0)


def test_simulator_charges_a_run_that_ends_between_passes():
    """Two whole-GPU jobs of one team, both ending before the next pass: their usage still counts."""
    jobs = [TraceJob(job_id=i, gpus=1, submit_s=0.0, duration_s=100.0 * i, model="m", team="a") for i in (1, 2)]
    quotas = {"a": TeamQuotaView("a", 2, may_borrow=True), "b": TeamQuotaView("b", 2, may_borrow=True)}

    def place_all(snap: Snapshot) -> Decisions:
        return Decisions(tuple(Placement(p.job_id, (p.job_id - 1,)) for p in snap.pending))

    half_life = 1000.0
    sim = Simulator(jobs, build_hosts(1, 2), place_all, quotas, config=PolicyConfig(usage_half_life_s=half_life))
    result = sim.run("all")
    expected = decayed_gpu_seconds(1, None, 0.0, 100.0, 200.0, half_life) + decayed_gpu_seconds(
        1, None, 0.0, 200.0, 200.0, half_life)
    assert result.teams["a"].recent_usage_gpu_seconds == pytest.approx(expected)
    assert result.teams["b"].recent_usage_gpu_seconds == 0.0


def test_similarity_key():
    assert similarity_key({"builtin": "mlp-digits", "params": {}}) == "builtin:mlp-digits"
    assert similarity_key({"command": ["python", "/src/train.py", "--lr", "1"]}) == "command:train.py"
    assert similarity_key({"command": ["/opt/bin/trainer", "--fast"]}) == "command:trainer"
    assert similarity_key({"command": []}) == similarity_key({}) == "command:"
    # The simulator keys a trace job as the console keys a built-in.
    trace_job = TraceJob(job_id=1, gpus=1, submit_s=0.0, duration_s=1.0, model="dqn")
    assert similarity_key(trace_job.workload) == "builtin:dqn"
