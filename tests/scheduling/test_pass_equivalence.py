"""The console pass decides exactly as it did before it was made faster (issue 19, point 5).

Every case's full decisions (placements with their GPUs and shares, preemptions with their reasons, each waiting
job's reason, code, position, estimated start, predicted run time and confidence, and wake_at) are serialized
canonically (JSON, floats as repr: exact) and hashed; pass_equivalence.json holds the hashes recorded with the code
before the speed-up (commit 8dae13c), beside a few readable counts. Cases: synthetic snapshots of several sizes
and seeds (the benchmark's 10,000 jobs on 1,024 GPUs included) under the console, fifo-backfill and fair-share
policies and other settings; quotas with user caps, spent budgets and a team without quota; fractions of GPUs
with memory requests and image jobs on container hosts; a runtime history; and the first jobs of Muri trace3
replayed by the simulator, every pass's decisions hashed in turn (the simulator is part of that case: a change
to simulation.py that changes what it feeds the pass changes the hash too).

Every case runs without defragmentation (PolicyConfig.defragment, added after the recording: it changes decisions on
purpose; tests/scheduling/test_defrag.py checks it).

Regenerate (only from code whose decisions are known right): python -m tests.scheduling.test_pass_equivalence
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.prediction import FinishedRun, RuntimeHistory
from apps.scheduling.simulate import assign_teams, team_quotas
from apps.scheduling.simulation import Simulator
from apps.scheduling.synthetic import synthetic_snapshot
from apps.scheduling.trace import build_hosts, load_trace, with_declarations
from apps.scheduling.types import Decisions, GpuView, HostView, Snapshot

FIXTURE = Path(__file__).with_name("pass_equivalence.json")
TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "muri" / "trace3.csv"
TRACE_JOBS = 300


def canonical(decisions: Decisions) -> str:
    return json.dumps(
        {
            "placements": [[p.job_id, list(p.gpu_ids), p.borrowing, p.gpu_share] for p in decisions.placements],
            "preemptions": [[p.job_id, p.reason, p.for_job] for p in decisions.preemptions],
            "pending": [
                [job_id, i.reason, i.position, i.estimated_start, i.code, i.predicted_runtime_s, i.confidence]
                for job_id, i in sorted(decisions.pending.items())
            ],
            "wake_at": decisions.wake_at,
        },
        sort_keys=True,
    )


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def summary(decisions: Decisions) -> dict[str, object]:
    estimated = [i.estimated_start for i in decisions.pending.values() if i.estimated_start is not None]
    first = min(decisions.pending.items(), key=lambda item: item[1].position, default=None)
    return {
        "sha256": digest(canonical(decisions)),
        "placed": len(decisions.placements),
        "preempted": len(decisions.preemptions),
        "waiting": len(decisions.pending),
        "estimated": len(estimated),
        "last_estimate": max(estimated, default=None),
        "first_waiting": None if first is None else [first[0], first[1].code, first[1].estimated_start],
    }


# -- synthetic cases ---------------------------------------------------------------------------------------------


def with_quotas(snapshot: Snapshot) -> Snapshot:
    """User caps in two teams, a spent budget (one team stopping its jobs), a team without quota."""
    quotas = dict(snapshot.quotas)
    quotas["team0"] = replace(quotas["team0"], user_max_gpus={"team0-u1": 4, "team0-u2": 8, "team0-u3": 1})
    quotas["team1"] = replace(quotas["team1"], user_max_gpus={"team1-u0": 2}, max_gpus=quotas["team1"].max_gpus // 2)
    quotas["team2"] = replace(quotas["team2"], budget_spent=True, stop_when_spent=True)
    quotas["team3"] = replace(quotas["team3"], budget_spent=True)
    del quotas["team5"]
    return replace(snapshot, quotas=quotas)


def with_fractions(snapshot: Snapshot, seed: int) -> Snapshot:
    """GPUs with memory, half the hosts running containers; a third of the 1-GPU jobs ask for a share or memory,
    some waiting jobs have an image; some running 1-GPU jobs hold half a GPU."""
    rng = random.Random(seed)
    hosts = tuple(
        HostView(
            h.name,
            tuple(GpuView(g.gpu_id, g.index, g.gpu_type, g.schedulable, 80_000 if g.gpu_type == "h100" else 40_000)
                  for g in h.gpus),
            h.schedulable,
            runs_containers=i % 2 == 0,
        )
        for i, h in enumerate(snapshot.hosts)
    )
    pending = []
    for job in snapshot.pending:
        if job.gpus == 1 and rng.random() < 0.35:
            kind = rng.randrange(3)
            if kind == 0:
                job = replace(job, gpu_share=rng.choice((0.25, 0.5, 0.3)))
            elif kind == 1:
                job = replace(job, gpu_memory_mb=rng.choice((10_000, 20_000, 50_000)))
            else:
                job = replace(job, gpu_share=0.25, gpu_memory_mb=15_000)
        if rng.random() < 0.1:
            job = replace(job, needs_containers=True)
        pending.append(job)
    running = [
        replace(job, gpu_share=0.5) if job.gpus == 1 and rng.random() < 0.5 else job for job in snapshot.running
    ]
    return replace(snapshot, hosts=hosts, pending=tuple(pending), running=tuple(running))


def with_history(snapshot: Snapshot, seed: int) -> Snapshot:
    rng = random.Random(seed)
    history = RuntimeHistory()
    for _ in range(400):
        team = f"team{rng.randrange(8)}"
        steps = rng.randrange(1_000, 50_000)
        step_s = rng.uniform(0.1, 2.0)
        history.record(
            f"{team}-u{rng.randrange(10)}",
            f"model{rng.randrange(20)}",
            FinishedRun(
                gpus=rng.choice((1, 2, 4, 8)),
                runtime_s=steps * step_s * rng.uniform(0.8, 1.2),
                step_s=step_s,
                declared_steps=steps if rng.random() < 0.7 else None,
                steps=int(steps * rng.uniform(0.7, 1.3)),
            ),
        )
    return replace(snapshot, history=history)


def with_services(snapshot: Snapshot) -> Snapshot:
    """Some running jobs are replicas of services (kept serving under shortest-first preemption), some not
    preemptible, some long preempted (protection grows)."""
    running = []
    for i, job in enumerate(snapshot.running):
        if i % 7 == 0:
            job = replace(job, service_group=f"svc{i % 3}")
        elif i % 11 == 0:
            job = replace(job, preemptible=False)
        elif i % 5 == 0:
            job = replace(job, preemption_count=4)
        running.append(job)
    pending = [replace(j, preemptible=False) if j.job_id % 13 == 0 else j for j in snapshot.pending]
    return replace(snapshot, running=tuple(running), pending=tuple(pending))


def synthetic_cases() -> dict[str, tuple[Callable[[], Snapshot], PolicyConfig]]:
    return {name: (build, replace(config, defragment=False)) for name, (build, config) in _synthetic_cases().items()}


def _synthetic_cases() -> dict[str, tuple[Callable[[], Snapshot], PolicyConfig]]:
    console = PolicyConfig()
    return {
        "small": (lambda: synthetic_snapshot(200, 8, 8, seed=2), console),
        "tiny-idle": (lambda: synthetic_snapshot(20, 16, 8, seed=9), console),
        "medium": (lambda: synthetic_snapshot(2_000, 32, 8, seed=3), console),
        "benchmark-10k": (lambda: synthetic_snapshot(10_000, 128, 8), console),
        "benchmark-10k-fifo-backfill": (
            lambda: synthetic_snapshot(10_000, 128, 8), PolicyConfig(policy="fifo-backfill")
        ),
        "medium-fifo-backfill": (lambda: synthetic_snapshot(2_000, 32, 8, seed=5), PolicyConfig(policy="fifo-backfill")),
        "medium-fair-share": (lambda: synthetic_snapshot(2_000, 32, 8, seed=6), PolicyConfig(policy="fair-share")),
        "medium-console-backfill": (
            lambda: synthetic_snapshot(2_000, 32, 8, seed=7),
            PolicyConfig(backfill=True, reserve_after_wait_s=3600.0),
        ),
        "medium-spread": (
            lambda: synthetic_snapshot(1_500, 24, 4, seed=8),
            PolicyConfig(consolidate=False, srpt_preemption=False, aging_s=0.0),
        ),
        "quotas": (lambda: with_quotas(synthetic_snapshot(1_500, 24, 8, seed=4)), console),
        "quotas-fifo-backfill": (
            lambda: with_quotas(synthetic_snapshot(1_500, 24, 8, seed=4)), PolicyConfig(policy="fifo-backfill")
        ),
        "fractions": (lambda: with_fractions(synthetic_snapshot(1_500, 24, 8, seed=10), 10), console),
        "fractions-10k": (lambda: with_fractions(synthetic_snapshot(10_000, 128, 8, seed=11), 11), console),
        "fractions-fifo-backfill": (
            lambda: with_fractions(synthetic_snapshot(1_000, 16, 8, seed=12), 12), PolicyConfig(policy="fifo-backfill")
        ),
        "history": (lambda: with_history(synthetic_snapshot(2_000, 32, 8, seed=13), 13), console),
        "history-10k": (lambda: with_history(synthetic_snapshot(10_000, 128, 8, seed=14), 14), console),
        "services": (lambda: with_services(synthetic_snapshot(2_000, 32, 8, seed=15)), console),
        "services-quotas-history": (
            lambda: with_history(with_services(with_quotas(synthetic_snapshot(3_000, 48, 8, seed=16))), 16),
            console,
        ),
    }


# -- trace cases -------------------------------------------------------------------------------------------------


def trace_run(policy: str, shares: bool = False) -> dict[str, object]:
    """The first TRACE_JOBS jobs of trace3 (2 teams that may borrow, noisy declarations) on 8x8 GPUs: every pass's
    decisions hashed in a chain."""
    jobs = assign_teams(with_declarations(load_trace(TRACE, "muri", "muri")[:TRACE_JOBS], "noisy", 0), 2)
    hosts = build_hosts(8, 8)
    config = PolicyConfig(policy=policy, defragment=False)
    chain = hashlib.sha256()
    counts = {"passes": 0, "placed": 0, "preempted": 0, "estimated": 0}

    def decide(snapshot: Snapshot) -> Decisions:
        if shares:
            pending = tuple(replace(j, gpu_share=0.5) if j.gpus == 1 and j.job_id % 2 else j for j in snapshot.pending)
            snapshot = replace(snapshot, pending=pending)
        decisions = schedule(snapshot, config)
        chain.update(canonical(decisions).encode())
        counts["passes"] += 1
        counts["placed"] += len(decisions.placements)
        counts["preempted"] += len(decisions.preemptions)
        counts["estimated"] += sum(1 for i in decisions.pending.values() if i.estimated_start is not None)
        return decisions

    sim = Simulator(jobs, hosts, decide, team_quotas(jobs, 64), config=config)
    result = sim.run(policy)
    ends = [s.finish for s in result.jobs if s.finish is not None]
    return {"sha256": chain.hexdigest(), **counts, "makespan_s": max(ends, default=None)}


TRACE_CASES = {
    "trace3-console": ("console", False),
    "trace3-fifo-backfill": ("fifo-backfill", False),
    "trace3-fair-share": ("fair-share", False),
    "trace3-console-half-shares": ("console", True),
}


def record_all() -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}
    for name, (build, config) in synthetic_cases().items():
        results[name] = summary(schedule(build(), config))
    if TRACE.exists():
        for name, (policy, shares) in TRACE_CASES.items():
            results[name] = trace_run(policy, shares)
    return results


def expected() -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(FIXTURE.read_text())
    return data


@pytest.mark.parametrize("name", list(synthetic_cases()))
def test_synthetic_pass_decides_as_recorded(name: str) -> None:
    build, config = synthetic_cases()[name]
    assert summary(schedule(build(), config)) == expected()[name]


@pytest.mark.skipif(not TRACE.exists(), reason="shared traces not present")
@pytest.mark.parametrize("name", list(TRACE_CASES))
def test_trace_passes_decide_as_recorded(name: str) -> None:
    policy, shares = TRACE_CASES[name]
    assert trace_run(policy, shares) == expected()[name]


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(record_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
