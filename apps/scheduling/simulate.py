"""Trace-driven simulator command line.

python -m apps.scheduling.simulate --trace FILE --format muri|tiresias --cluster 8x8 --policy NAME[,NAME|all]
    [--preempt-cost-s S] [--runtime-model duration|muri] [--teams N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from apps.scheduling.baselines import OracleShortest, OracleShortestJobFirst, Tiresias2DLAS
from apps.scheduling.config import PolicyConfig
from apps.scheduling.metrics import Summary, summarize
from apps.scheduling.policy import schedule
from apps.scheduling.simulation import Simulator
from apps.scheduling.trace import RUNTIME_MODELS, TraceJob, build_hosts, load_trace, parse_cluster
from apps.scheduling.types import Decisions, Snapshot, TeamQuotaView

CORE_POLICIES = ("fifo", "fifo-backfill", "fair-share", "console")
BASELINE_POLICIES = ("sjf-oracle", "srtf-oracle", "srsf-oracle", "tiresias-2dlas")
POLICY_NAMES = (
    "fifo",
    "sjf-oracle",
    "srtf-oracle",
    "srsf-oracle",
    "tiresias-2dlas",
    "fair-share",
    "fifo-backfill",
    "console",
)


def assign_teams(jobs: list[TraceJob], teams: int) -> list[TraceJob]:
    """Spread a team-less trace over N teams (job id modulo N), each user its own per team."""
    if teams <= 1:
        return jobs
    return [
        replace(job, team=f"team{job.job_id % teams}", user=f"user{job.job_id % (2 * teams)}") for job in jobs
    ]


def team_quotas(jobs: list[TraceJob], total_gpus: int) -> dict[str, TeamQuotaView]:
    """Equal guarantees that add up to the cluster, with borrowing of idle GPUs."""
    names = sorted({job.team for job in jobs})
    if len(names) == 1:
        return {names[0]: TeamQuotaView(names[0], total_gpus)}
    each = total_gpus // len(names)
    return {name: TeamQuotaView(name, each, may_borrow=True) for name in names}


def make_decider(name: str, sim: Simulator, config: PolicyConfig) -> Callable[[Snapshot], Decisions]:
    if name in CORE_POLICIES:
        policy_config = replace(config, policy=name)
        return lambda snapshot: schedule(snapshot, policy_config)
    if name == "srtf-oracle":
        return OracleShortest(sim.true_remaining, by_service=False).decide
    if name == "srsf-oracle":
        return OracleShortest(sim.true_remaining, by_service=True).decide
    if name == "sjf-oracle":
        return OracleShortestJobFirst(sim.true_remaining).decide
    if name == "tiresias-2dlas":
        return Tiresias2DLAS().decide
    raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICY_NAMES)} or all")


def simulate(
    jobs: list[TraceJob],
    cluster: str,
    policy: str,
    preempt_cost_s: float = 0.0,
    config: PolicyConfig | None = None,
) -> Summary:
    config = config or PolicyConfig()
    num_hosts, per_host = parse_cluster(cluster)
    hosts = build_hosts(num_hosts, per_host)
    quotas = team_quotas(jobs, num_hosts * per_host)
    # Only the console-side policies see declared steps and step times; oracles read true durations instead.
    sim = Simulator(jobs, hosts, schedule, quotas, preempt_cost_s, config, console_view=True)
    sim.decide = make_decider(policy, sim, config)
    return summarize(sim.run(policy))


def parse_policies(text: str) -> list[str]:
    names = list(POLICY_NAMES) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        raise SystemExit(f"unknown policy {', '.join(unknown)}; expected {', '.join(POLICY_NAMES)} or all")
    return names


def format_table(summaries: Sequence[Summary]) -> str:
    header = (
        f"{'policy':<16}{'avg JCT h':>11}{'p50 h':>9}{'p99 h':>9}{'makespan h':>12}{'queue h':>9}"
        f"{'util':>7}{'preempt':>9}{'migrate':>9}"
    )
    lines = [header]
    for s in summaries:
        lines.append(
            f"{s.policy:<16}{s.avg_jct_h:>11.1f}{s.p50_jct_h:>9.1f}{s.p99_jct_h:>9.1f}{s.makespan_h:>12.1f}"
            f"{s.mean_queueing_delay_h:>9.1f}{s.gpu_utilization:>7.2f}{s.preemptions:>9}{s.migrations:>9}"
        )
        for team, figures in s.teams.items():
            lines.append(
                f"    {team:<12} GPU share {figures.gpu_share:.2f}  finish-time fairness "
                f"{figures.finish_time_fairness:.2f}"
            )
        if s.worst_finish_time_fairness is not None:
            lines.append(f"    worst finish-time fairness {s.worst_finish_time_fairness:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m apps.scheduling.simulate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--trace", required=True)
    parser.add_argument("--format", choices=("muri", "tiresias"), required=True)
    parser.add_argument("--cluster", default="8x8", help="HOSTSxGPUS, e.g. 8x8")
    parser.add_argument("--policy", default="console", help="a name, a comma list, or all")
    parser.add_argument("--preempt-cost-s", type=float, default=0.0, help="lost seconds per restart")
    parser.add_argument("--runtime-model", choices=RUNTIME_MODELS, default="duration")
    parser.add_argument("--teams", type=int, default=1, help="spread a team-less trace over N teams")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    jobs = assign_teams(load_trace(args.trace, args.format, args.runtime_model), args.teams)
    summaries = []
    seconds = {}
    for name in parse_policies(args.policy):
        started = time.perf_counter()
        summaries.append(simulate(jobs, args.cluster, name, args.preempt_cost_s))
        seconds[name] = time.perf_counter() - started
    if args.json:
        print(
            json.dumps([{**s.as_dict(), "wall_s": round(seconds[s.policy], 2)} for s in summaries], indent=2)
        )
    else:
        print(format_table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
