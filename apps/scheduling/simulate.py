"""Trace-driven simulator command line.

`console-share` is the console policy with packing (packing.py): after each pass, jobs it left waiting join
running jobs of the same GPU count on their GPUs, in groups of up to PACK_LIMIT interleaved jobs whose predicted
slowdowns (interference.py's joint-round model, on profiles the console would have measured) all stay under a
bound (PackingConfig: 1.5x, throughput gain > 0.2, no switch overhead unless --switch-overhead); the simulator
charges every member the slowdown the model gives on the jobs' true profiles and re-times the group as members
come and go. What the policy knows of a job's profile: its own step and per-resource times once it has run
MEASURE_S, before that those of the last measured job of the same model (of the same GPU count if any), else
nothing (the job is not packed).

python -m apps.scheduling.simulate --trace FILE --format muri|tiresias --cluster 8x8 --policy NAME[,NAME|all]
    [--preempt-cost-s S] [--runtime-model duration|muri] [--teams N] [--declarations MODE] [--seed N]
    [--pass-interval-s S] [--json]

Passes run at arrivals, ends, the pass's own wake-ups and, while jobs wait and others run, at least every
--pass-interval-s (BEAT_S, 300 s, by default; 0: never), as the console's beat runs one every few seconds: the
pass's wake-ups do not foresee a running job's score growing past the preemption bar between two events.
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
from apps.scheduling.interference import Profile, profile
from apps.scheduling.metrics import EstimateFigures, Summary, summarize
from apps.scheduling.packing import PackingConfig, groups_of, plan_packing
from apps.scheduling.policy import schedule
from apps.scheduling.simulation import MIN_PASS_INTERVAL_S, Simulator, beat
from apps.scheduling.trace import (
    DECLARATION_MODES,
    RUNTIME_MODELS,
    TraceJob,
    build_hosts,
    load_trace,
    parse_cluster,
    with_declarations,
)
from apps.scheduling.types import Decisions, Preemption, Snapshot, TeamQuotaView

# console-share: a job's own step and per-resource times are known once it has run this long (its runtime's
# progress records); before that only those measured earlier on a job of the same workload (model) are.
MEASURE_S = 600.0
# The simulated console beat: a pass at least this often while jobs wait and others run. The console passes every
# CONSOLE_SCHEDULER_INTERVAL_S (5 s); 300 s keeps a simulated year of trace4 within minutes, and is within 1 h of
# 60 s on trace3 without declarations (82.9 h against 83.9 h; without a beat 86.6 h).
BEAT_S = 300.0
CORE_POLICIES = ("fifo", "fifo-backfill", "fair-share", "console")
POLICY_NAMES = (
    "fifo",
    "sjf-oracle",
    "srtf-oracle",
    "srsf-oracle",
    "srsf-declared",
    "tiresias-2dlas",
    "fair-share",
    "fifo-backfill",
    "console",
    "console-share",
)


def _beat_option(text: str) -> float | None:
    """--pass-interval-s as the simulator takes it: 0 is no beat (None); shorter than MIN_PASS_INTERVAL_S or
    infinite is refused (simulation.beat)."""
    try:
        return beat(float(text) or None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 0 (no beat) or at least {MIN_PASS_INTERVAL_S:g} seconds, not {text!r}"
        ) from None


def add_beat_argument(parser: argparse.ArgumentParser) -> None:
    """The command lines' --pass-interval-s (this one, benchmarks/scheduler.py, the Pollux table): the parsed value
    is what Simulator and simulate() take."""
    parser.add_argument(
        "--pass-interval-s", type=_beat_option, default=BEAT_S,
        help=f"also pass at least this often while jobs wait and others run (the console's beat; default "
        f"{BEAT_S:g}); 0: only at arrivals, ends and the pass's wake-ups",
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


def console_share(
    sim: Simulator, config: PolicyConfig, packing: PackingConfig | None = None
) -> Callable[[Snapshot], Decisions]:
    """The console policy, then packing (packing.py) of the jobs it left waiting onto running groups; the pass sees
    each group as its first member alone (the others are offered to it as waiting, so it may move one onto free
    GPUs: a migration), and a group whose first member it preempts is preempted whole."""
    policy_config = replace(config, policy="console")
    pack_config = packing or PackingConfig(switch_overhead=sim.switch_overhead)
    # What the console has measured of a workload: its step and per-resource times, by (model, GPUs) and by model.
    measured: dict[tuple[str, int], Profile] = {}
    by_model: dict[str, Profile] = {}

    def profile_of(job_id: int) -> Profile | None:
        state = sim.jobs[job_id]
        trace = state.trace
        if state.first_start is not None and trace.step_s and sim.now - state.first_start >= MEASURE_S:
            found = profile(trace.step_s, trace.resource_s)
            measured[(trace.model, trace.gpus)] = found
            by_model[trace.model] = found
            return found
        return measured.get((trace.model, trace.gpus)) or by_model.get(trace.model)

    def decide(snapshot: Snapshot) -> Decisions:
        groups = [members for members in groups_of(snapshot.running).values() if len(members) > 1]
        if not groups:
            return schedule(snapshot, policy_config)
        started = {job.job_id: (job.started_at, job.job_id) for job in snapshot.running}
        firsts = {members[0]: members for members in (sorted(g, key=started.__getitem__) for g in groups)}
        others = [j for members in firsts.values() for j in members[1:]]
        hidden = set(others)
        core = replace(
            snapshot,
            running=tuple(j for j in snapshot.running if j.job_id not in hidden),
            pending=snapshot.pending + tuple(sim.waiting_view(j) for j in others),
        )
        decisions = schedule(core, policy_config)
        # A packed job is already running: it may move to free GPUs, but nothing is stopped to make room for it.
        gpus_of = {job.job_id: job.gpu_ids for job in snapshot.running}
        dropped = {p.job_id for p in decisions.preemptions if p.for_job in hidden}
        kept_gpus = {g for j in dropped for g in gpus_of.get(j, ())}
        preemptions = tuple(p for p in decisions.preemptions if p.job_id not in dropped)
        placements = tuple(p for p in decisions.placements if not kept_gpus.intersection(p.gpu_ids))
        stopped = {p.job_id for p in preemptions}
        placed = {p.job_id for p in placements}
        extra = [Preemption(j, "moved from its packed group to GPUs of its own") for j in others if j in placed]
        for first, members in firsts.items():
            if first in stopped:
                extra += [
                    Preemption(j, "its packed group's GPUs were taken")
                    for j in members[1:]
                    if j not in placed and j not in stopped
                ]
        pending = {j: info for j, info in decisions.pending.items() if j not in hidden}
        return replace(decisions, placements=placements, preemptions=preemptions + tuple(extra), pending=pending)

    def pack(snapshot: Snapshot, decisions: Decisions) -> list[tuple[int, tuple[int, ...]]]:
        for job in snapshot.running:  # every running job is being measured (those just placed too)
            profile_of(job.job_id)
        if not snapshot.pending:
            return []
        stopped = {p.job_id for p in decisions.preemptions}
        last = len(snapshot.pending) + 1
        waiting = sorted(
            (j for j in snapshot.pending if j.job_id not in stopped),
            key=lambda j: (info.position if (info := decisions.pending.get(j.job_id)) else last, j.job_id),
        )
        return plan_packing(waiting, snapshot.running, profile_of, pack_config)

    sim.pack = pack
    return decide


def make_decider(
    name: str, sim: Simulator, config: PolicyConfig, packing: PackingConfig | None = None
) -> Callable[[Snapshot], Decisions]:
    if name == "console-share":
        return console_share(sim, config, packing)
    if name in CORE_POLICIES:
        policy_config = replace(config, policy=name)
        return lambda snapshot: schedule(snapshot, policy_config)
    if name == "srtf-oracle":
        return OracleShortest(sim.true_remaining, by_service=False).decide
    if name == "srsf-oracle":
        return OracleShortest(sim.true_remaining, by_service=True).decide
    if name == "srsf-declared":
        # SRSF on what jobs declare instead of the truth: shortest-first on users' estimates, nothing learned
        return OracleShortest(sim.declared_remaining, by_service=True).decide
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
    switch_overhead: float = 0.0,
    packing: PackingConfig | None = None,
    pass_interval_s: float | None = None,
) -> Summary:
    config = config or PolicyConfig()
    num_hosts, per_host = parse_cluster(cluster)
    hosts = build_hosts(num_hosts, per_host)
    quotas = team_quotas(jobs, num_hosts * per_host)
    # Only the console-side policies see declared steps and step times; oracles read true durations instead.
    sim = Simulator(
        jobs,
        hosts,
        schedule,
        quotas,
        preempt_cost_s,
        config,
        console_view=True,
        switch_overhead=switch_overhead,
        pass_interval_s=pass_interval_s,
    )
    sim.decide = make_decider(policy, sim, config, packing)
    return summarize(sim.run(policy))


def parse_policies(text: str) -> list[str]:
    names = list(POLICY_NAMES) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        raise SystemExit(f"unknown policy {', '.join(unknown)}; expected {', '.join(POLICY_NAMES)} or all")
    return names


def format_estimates(e: EstimateFigures) -> str:
    return (
        f"start estimates at submission ({e.waited} jobs waited, {100 * e.coverage:.0f}% estimated): "
        f"|error| median {e.median_abs_error_h:.2f} h, p90 {e.p90_abs_error_h:.2f} h (median wait "
        f"{e.median_wait_h:.2f} h); median error/wait {e.median_relative_error:.2f}; "
        f"{100 * e.within_25pct:.0f}% within +-25% of their wait"
    )


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
        if s.estimates is not None:
            lines.append(f"    {format_estimates(s.estimates)}")
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
    parser.add_argument(
        "--switch-overhead", type=float, default=0.0, help="interference: extra round fraction per extra job"
    )
    parser.add_argument(
        "--declarations",
        choices=DECLARATION_MODES,
        default="trace",
        help="what jobs declare: as the trace says (its declared_iterations column, else the truth), exact, "
        "noisy (lognormal sigma 1), partial (30%% declare nothing) or none",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the noisy and partial declarations")
    add_beat_argument(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    jobs = assign_teams(load_trace(args.trace, args.format, args.runtime_model), args.teams)
    jobs = with_declarations(jobs, args.declarations, args.seed)
    summaries = []
    seconds = {}
    for name in parse_policies(args.policy):
        started = time.perf_counter()
        summaries.append(simulate(jobs, args.cluster, name, args.preempt_cost_s, None, args.switch_overhead,
                                  pass_interval_s=args.pass_interval_s))
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
