"""The README's table: console against the SRSF oracle and Tiresias on the Pollux traces, per workload and load.

    python benchmarks/traces/pollux/table.py [--traces pollux] [--load 1] [--declarations exact,none] [--seed 0]
        [--preempt-cost-s 0] [--pass-interval-s 300]

Runs fifo, srtf-oracle, srsf-oracle and tiresias-2dlas once per trace and load (they read no declarations) and
the console once per declaration mode, on 16 x 4 GPUs, every policy charged the same seconds per restart after a
preemption (none by default, as benchmarks/scheduler.py with --preempt-cost-s 0; Pollux's simulator charges 30),
and prints one markdown row per (trace, load, mode): average / p50 / p99 JCT in hours, then
the console's ratios. The last rows average the figures over the traces of one Pollux set, load and mode.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from apps.scheduling.metrics import Summary  # noqa: E402
from apps.scheduling.simulate import add_beat_argument, simulate  # noqa: E402
from apps.scheduling.trace import with_declarations, with_load  # noqa: E402
from benchmarks.scheduler import expand_traces, load_named_trace, trace_setup  # noqa: E402

BASELINES = ("fifo", "srtf-oracle", "srsf-oracle", "tiresias-2dlas")
FIGURES = ("avg_jct_h", "p50_jct_h", "p99_jct_h")


def three(s: dict[str, float]) -> str:
    return " / ".join(f"{s[f]:.2f}" for f in FIGURES)


def row(trace: str, load: float, mode: str, f: dict[str, dict[str, float]]) -> str:
    console, srsf, las = f["console"], f["srsf-oracle"], f["tiresias-2dlas"]
    return (
        f"| {trace} | {pollux_load(trace)} | x{load:g} | {mode} | {three(console)} | {three(srsf)} | {f['srtf-oracle']['avg_jct_h']:.2f} | "
        f"{three(las)} | {f['fifo']['avg_jct_h']:.2f} | {console['avg_jct_h'] / srsf['avg_jct_h']:.2f} | "
        f"{console['avg_jct_h'] / las['avg_jct_h']:.2f}, {console['p99_jct_h'] / las['p99_jct_h']:.2f} |"
    )


def pollux_load(trace: str) -> str:
    """The Pollux workload set a trace comes from: pollux-wN is their normal load (1.0), pollux-2.0-wN their 2x."""
    parts = trace.split("-")
    return parts[1] if len(parts) == 3 else "1.0"


def figures(summary: Summary) -> dict[str, float]:
    return {f: getattr(summary, f) for f in FIGURES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="pollux")
    parser.add_argument("--load", default="1")
    parser.add_argument("--declarations", default="exact,none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--preempt-cost-s", type=float, default=0.0, help="seconds lost per restart, every policy"
    )
    add_beat_argument(parser)
    args = parser.parse_args(argv)
    every = args.pass_interval_s
    loads = [float(x) for x in args.load.split(",")]
    modes = args.declarations.split(",")
    print(
        "| trace | Pollux load | our --load | declarations | console avg / p50 / p99 h | SRSF oracle avg / p50 / p99 h | SRTF avg h | "
        "Tiresias avg / p50 / p99 h | FIFO avg h | console / SRSF (avg) | console / Tiresias (avg, p99) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    runs: dict[tuple[str, float, str], list[dict[str, dict[str, float]]]] = {}
    for trace in expand_traces(args.traces.split(",")):
        cluster, model = trace_setup(trace, "duration")
        truth = load_named_trace(REPO / "nonexistent", trace, model)
        for load in loads:
            jobs = with_load(truth, load)
            cost = args.preempt_cost_s
            base = {
                name: figures(simulate(jobs, cluster, name, cost, pass_interval_s=every)) for name in BASELINES
            }
            for mode in modes:
                declared = with_declarations(jobs, mode, args.seed)
                console = simulate(declared, cluster, "console", cost, pass_interval_s=every)
                f = {**base, "console": figures(console)}
                runs.setdefault((pollux_load(trace), load, mode), []).append(f)
                print(row(trace, load, mode, f), flush=True)
    for (set_load, load, mode), found in runs.items():
        if len(found) > 1:
            mean = {
                p: {f: statistics.fmean(r[p][f] for r in found) for f in FIGURES}
                for p in (*BASELINES, "console")
            }
            name = f"mean of {len(found)}" + ("" if set_load == "1.0" else f" ({set_load})")
            print(row(name, load, mode, mean).replace(f"| {pollux_load(name)} |", f"| {set_load} |", 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
