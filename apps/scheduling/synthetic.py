"""Seeded synthetic snapshots of a large cluster, for timing a scheduling pass (and for tests)."""

from __future__ import annotations

import random

from apps.scheduling.types import GpuView, HostView, PendingJob, Priority, RunningJob, Snapshot, TeamQuotaView

GANG_SIZES = (1, 1, 1, 1, 2, 2, 4, 4, 8, 16)


def synthetic_snapshot(
    pending: int = 10_000, hosts: int = 128, gpus_per_host: int = 8, teams: int = 8, seed: int = 1
) -> Snapshot:
    """A busy cluster: a quarter of the hosts H100, the rest A100; ~1% of GPUs unhealthy; ~90% of GPUs busy."""
    rng = random.Random(seed)
    now = 1_000_000.0
    host_views = []
    for h in range(hosts):
        gpu_type = "h100" if h % 4 == 0 else "a100"
        gpus = tuple(
            GpuView(h * gpus_per_host + i, i, gpu_type, schedulable=rng.random() > 0.01)
            for i in range(gpus_per_host)
        )
        host_views.append(HostView(f"host{h:04d}", gpus, schedulable=h != hosts - 1))
    team_names = [f"team{t}" for t in range(teams)]
    total = hosts * gpus_per_host
    quotas = {
        name: TeamQuotaView(
            name,
            max_gpus=total // teams,
            share=1.0 + t % 3,
            recent_usage_gpu_seconds=rng.uniform(0, 1e7),
            may_borrow=t % 2 == 0,
        )
        for t, name in enumerate(team_names)
    }

    running = []
    job_id = 1
    for host in host_views[:-1]:
        free = [g.gpu_id for g in host.gpus if g.schedulable]
        while free and rng.random() < 0.95:
            size = min(len(free), rng.choice((1, 2, 4, 8)))
            ids, free = tuple(free[:size]), free[size:]
            team = rng.choice(team_names)
            running.append(
                RunningJob(
                    job_id=job_id,
                    team=team,
                    user=f"{team}-u{rng.randrange(10)}",
                    gpus=size,
                    priority=Priority(rng.choice((0, 1, 1, 1, 2))),
                    gpu_ids=ids,
                    started_at=now - rng.uniform(0, 200_000),
                    submitted_at=now - rng.uniform(200_000, 400_000),
                    gpu_type=host.gpus[0].gpu_type if rng.random() < 0.3 else None,
                    declared_steps=rng.randrange(1_000, 100_000) if rng.random() < 0.5 else None,
                    observed_step_s=rng.uniform(0.1, 2.0),
                    borrowing=rng.random() < 0.1,
                    similarity_key=f"model{rng.randrange(20)}",
                )
            )
            job_id += 1
    waiting = []
    for _ in range(pending):
        team = rng.choice(team_names)
        declared = rng.random() < 0.5
        waiting.append(
            PendingJob(
                job_id=job_id,
                team=team,
                user=f"{team}-u{rng.randrange(10)}",
                gpus=rng.choice(GANG_SIZES),
                priority=Priority(rng.choice((0, 1, 1, 1, 1, 2, 3))),
                submitted_at=now - rng.uniform(0, 300_000),
                gpu_type=rng.choice(("a100", "h100")) if rng.random() < 0.3 else None,
                declared_steps=rng.randrange(1_000, 100_000) if declared else None,
                observed_step_s=rng.uniform(0.1, 2.0) if declared and rng.random() < 0.3 else None,
                time_limit_s=rng.choice((None, 3600.0, 86_400.0)),
                similarity_key=f"model{rng.randrange(20)}",
            )
        )
        job_id += 1
    return Snapshot(
        now=now, hosts=tuple(host_views), pending=tuple(waiting), running=tuple(running), quotas=quotas
    )
