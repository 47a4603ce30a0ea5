"""Start-estimate lab: try another estimator on a trace in minutes, with the same decisions and real starts.

Estimates are output only, so the real starts of a console simulation do not depend on them. `capture` runs the
simulation once (on the benchmark's beat, simulate.BEAT_S) and keeps, for every instant at which jobs were
submitted, the snapshot of the last pass there (pickled as it was then: the runtime history changes later) and the
real starts. `evaluate` runs the pass again
on each kept snapshot with another arrival model (scheduler.expected_arrivals swapped) and scores the estimates
given to the jobs submitted then as benchmarks/scheduler.py does (metrics.EstimateFigures): with `current` it
prints the benchmark's figures exactly.

Arrival models: current (estimate.expected_arrivals), none (no expected submission), oracle (the true next
submissions, each with the order its own submission pass gave it: the bound on what guessing them can give),
sweep (the true rest of the sweep going on only: what a sweep submitted as one array of jobs would tell),
sweep-count (the true times of the rest of the sweep, its jobs guessed from those so far: a declared size),
sweep-size (what a declared size alone tells: the rest of the sweep's jobs, each a copy of one so far, expected
at the rate the sweep has kept so far), window-H (a steady stream: the last H hours of submissions, finished jobs
included, come again H hours later; window-H+burst adds the current model's sweep; window-H/N takes every N-th).
Measured (exact declarations, median error of the wait): trace4 current 0.473, sweep-size 0.308, sweep 0.061;
trace3 current 0.341, sweep-size 0.387, sweep 0.297. (Since victims are stopped in the replay as the pass stops them,
estimate.py: trace3 current 0.304, oracle 0.161; trace4 current 0.485, oracle 0.053. Without declarations trace3
0.585; trace4 0.995, oracle 0.997: there a third of the jobs that wait are told they start within the hour and
wait days, which the true next submissions do not explain. Understood since: each of the hundreds of jobs of a
burst ahead was taken to hold its GPU for its median-like prediction, three minutes, where attained service let it
run about twenty before stopping it; with the hold the cluster's runs say (scheduler._with_slices,
RuntimeHistory.expected_hold_s) trace4 without declarations 0.763 -> 0.461 (oracle arrivals the same: it is not
the arrivals), trace3 0.251 -> 0.165; exact unchanged, trace4 0.454, trace3 0.236. Arrival models on trace4 exact:
window-24 0.485, -72 0.504, -168 0.547, all worse than current.) A declared size alone helps on trace4 and hurts on trace3
(copies of the sweep's jobs so far are not its later jobs); what the rest of the sweep really is (an array of
jobs submitted as one) is what brings trace4 under 25 %. On trace3 the true next submissions (oracle) give 0.180,
the rest of the sweep only 0.297, a steady stream worse than none (none 0.346; window-2 0.393, -6 0.361, -24 0.377,
-6+burst 0.354; thinner streams, window-24/2 0.389, -24/4 0.404, -72/3 0.349): its arrivals come in irregular clusters that no rate from the past foretells; its long waits
(over 6 h, 204 of 330) are estimated about a quarter too early (median log(estimate / real wait) -0.32).
`--true-runtimes TRACE` tells the replay every job's true run time (running jobs' ends, waiting jobs' run times; no
hold of unknown length), with the pass's decisions unchanged (checked on trace3 noisy, every instant, and trace4
without declarations, every tenth): the bound on what better run-time predictions can give. Median error of the
wait (eighteenth session; "arrivals": the true next submissions, `oracle`):

| trace, declarations | now | true arrivals | true run times | both |
|---|---|---|---|---|
| trace3 noisy | 0.638 | 0.732 | 0.321 | 0.181 |
| trace3 partial | 0.356 | 0.334 | 0.305 | 0.135 |
| trace4 exact | 0.454 | 0.036 | 0.481 | 0.054 |
| trace4 noisy | 0.748 | 0.578 | 0.583 | 0.146 |
| trace4 partial | 0.498 | 0.349 | 0.606 | 0.224 |
| trace4 none | 0.461 | 0.471 | 0.686 | 0.445 |

With declarations no estimator reaches 25 % without the future submissions (and on the noisy and partial modes,
without both). Without declarations on trace4 neither helps: there the replay's model of attained service's time
slices (a job stopped at the first later queue where it is outranked, only the first SLICED_JOBS, orders fixed at
submission) is what differs from the pass's real course.
`--calibrate` also scores an online calibration of the current estimates: each estimated wait scaled by the
median real / estimated wait of the last 50 jobs of its horizon class (log2 of wait / 10 min) known at that time
(started, or still waiting past their estimate: a lower bound).

    python benchmarks/estimate_lab.py capture --trace trace4 --declarations exact --out /tmp/t4-exact.pkl
    python benchmarks/estimate_lab.py evaluate /tmp/t4-exact.pkl --models current,none,oracle [--calibrate]
        [--true-runtimes trace4]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import pickle
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import apps.scheduling.ordering as ordering_module  # noqa: E402
import apps.scheduling.scheduler as scheduler_module  # noqa: E402
from apps.scheduling.config import PolicyConfig  # noqa: E402
from apps.scheduling.estimate import BURST_GAP_S, Waiting, expected_arrivals  # noqa: E402
from apps.scheduling.policy import schedule  # noqa: E402
from apps.scheduling.prediction import RuntimeHistory, elapsed_run_s  # noqa: E402
from apps.scheduling.simulate import BEAT_S, make_decider, team_quotas  # noqa: E402
from apps.scheduling.simulation import Simulator  # noqa: E402
from apps.scheduling.trace import build_hosts, load_trace, parse_cluster, with_declarations  # noqa: E402
from apps.scheduling.types import Decisions, Snapshot  # noqa: E402

# (now, recent submissions, the policy's aging_s) -> expected submissions, as estimate.expected_arrivals
ArrivalModel = Callable[[float, Iterable[Waiting], float], list[tuple[float, Waiting]]]
# job id -> (submitted at, first start, waited after its submission pass)
Starts = Mapping[int, tuple[float, float | None, bool]]
# per instant: (pickled snapshot, ids of the jobs submitted then)
Instants = list[tuple[bytes, list[int]]]
CALIBRATION_WINDOW = 50
CALIBRATION_MIN = 10


def capture(trace: str, mode: str, traces_dir: Path, out: Path) -> None:
    jobs = with_declarations(load_trace(traces_dir / "muri" / f"{trace}.csv", "muri", "muri"), mode, 0)
    config = PolicyConfig()
    sim = Simulator(
        jobs, build_hosts(*parse_cluster("8x8")), schedule, team_quotas(jobs, 64), 0.0, config, pass_interval_s=BEAT_S
    )
    console = make_decider("console", sim, config)
    instants: dict[float, tuple[bytes, list[int]]] = {}

    def decide(snapshot: Snapshot) -> Decisions:
        submitted = [job.job_id for job in snapshot.pending if job.submitted_at == snapshot.now]
        if submitted:
            instants[snapshot.now] = (pickle.dumps(snapshot, protocol=5), submitted)
        return console(snapshot)

    sim.decide = decide
    result = sim.run("console")
    starts = {s.trace.job_id: (s.trace.submit_s, s.first_start, s.waited_at_submit) for s in result.jobs}
    out.write_bytes(pickle.dumps((list(instants.values()), starts), protocol=5))
    print(f"{trace} {mode}: {len(instants)} submission instants -> {out}")


@contextlib.contextmanager
def true_runtimes(trace: str, traces_dir: Path) -> Iterator[None]:
    """While open, the pass's replay knows every job's true run time (the trace's, less what the job has run):
    running jobs' ends and waiting jobs' run times, and no hold of unknown length (the bound on what better run
    time predictions can give). The order's own estimates, and so the pass's decisions, are unchanged."""
    total = {job.job_id: job.duration_s for job in load_trace(traces_dir / "muri" / f"{trace}.csv", "muri", "muri")}
    predict, figures, hold = (scheduler_module.predict_remaining, ordering_module.NeverRun.figures,
                              RuntimeHistory.expected_hold_s)

    def left(job: Any, now: float) -> float:
        return max(1.0, total[job.job_id] - elapsed_run_s(job, now))

    def true_predict(job: Any, now: float, history: Any, default_s: float) -> tuple[float, float]:
        return left(job, now), predict(job, now, history, default_s)[1]

    def true_figures(self: Any, job: Any, default_s: float) -> tuple[float, float, float]:
        _, sure, gpu_s = figures(self, job, default_s)
        return left(job, 0.0), sure, gpu_s

    scheduler_module.predict_remaining = true_predict  # type: ignore[assignment]
    ordering_module.NeverRun.figures = true_figures  # type: ignore[method-assign]
    RuntimeHistory.expected_hold_s = lambda self, elapsed, stopped_at: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        scheduler_module.predict_remaining = predict  # type: ignore[assignment]
        ordering_module.NeverRun.figures = figures  # type: ignore[method-assign]
        RuntimeHistory.expected_hold_s = hold  # type: ignore[method-assign]


def estimates_with(instants: Instants, model: ArrivalModel) -> dict[int, float | None]:
    """job id -> its estimated start at submission, the pass's expected arrivals given by `model`."""
    config = PolicyConfig(policy="console")
    # (the pass calls the name it imported: swapped on the scheduler module, put back after)
    original = getattr(scheduler_module, "expected_arrivals")  # noqa: B009
    setattr(scheduler_module, "expected_arrivals", model)  # noqa: B010
    try:
        found: dict[int, float | None] = {}
        for blob, submitted in instants:
            decisions = schedule(pickle.loads(blob), config)
            for job_id in submitted:
                info = decisions.pending.get(job_id)
                found[job_id] = None if info is None else info.estimated_start
        return found
    finally:
        setattr(scheduler_module, "expected_arrivals", original)  # noqa: B010


def no_arrivals(now: float, recent: Iterable[Waiting], aging_s: float = 0.0) -> list[tuple[float, Waiting]]:
    return []


def submissions(instants: Instants) -> list[Waiting]:
    """Every job submitted, as its own submission pass saw it (the replay's entry), in submission order."""
    entries: dict[int, Waiting] = {}

    def keep(now: float, recent: Iterable[Waiting], aging_s: float = 0.0) -> list[tuple[float, Waiting]]:
        recent = list(recent)
        entries.update((w.job_id, w) for w in recent if w.order[2] == now)
        return expected_arrivals(now, recent, aging_s)

    estimates_with(instants, keep)
    return sorted(entries.values(), key=lambda w: w.order[2])


def oracle_model(instants: Instants, sweep_only: bool = False) -> ArrivalModel:
    """The true next submissions, each as its own submission pass saw it; `sweep_only`: only the rest of the
    sweep going on (each within BURST_GAP_S of the one before, the first of now), as if sweeps were submitted
    as one array of jobs."""
    future = submissions(instants)
    submitted_at = [w.order[2] for w in future]

    def model(now: float, recent: Iterable[Waiting], aging_s: float = 0.0) -> list[tuple[float, Waiting]]:
        first = bisect.bisect_right(submitted_at, now)
        last = len(future)
        if sweep_only:
            last, previous = first, now
            while last < len(future) and submitted_at[last] - previous <= BURST_GAP_S:
                previous = submitted_at[last]
                last += 1
        return [(w.order[2], replace(w, fixed_start=None, expected=True)) for w in future[first:last]]

    return model


def window_model(instants: Instants, window_s: float, with_burst: bool, every: int = 1) -> ArrivalModel:
    """The last `window_s` of submissions (finished jobs included, each as its own submission pass saw it) come
    again, `window_s` later: a steady stream of jobs, as the cluster's recent past tells it; `with_burst`: the
    sweep going on is expected too (expected_arrivals); `every`: only every n-th of them (a thinner stream)."""
    past = submissions(instants)
    submitted_at = [w.order[2] for w in past]

    def model(now: float, recent: Iterable[Waiting], aging_s: float = 0.0) -> list[tuple[float, Waiting]]:
        recent = list(recent)
        expected = expected_arrivals(now, recent, aging_s) if with_burst else []
        first = bisect.bisect_right(submitted_at, now - window_s)
        last = bisect.bisect_right(submitted_at, now)
        for n, w in enumerate(past[first:last:every]):
            at = w.order[2] + window_s
            priority, score, _, job_id = w.order
            expected.append((at, replace(w, order=(priority, score, at, -1 - job_id - (n + 1) * 10**7),
                                         fixed_start=None, expected=True)))
        return expected

    return model


def sweep_going_on(now: float, recent: Iterable[Waiting]) -> list[Waiting]:
    """The jobs submitted by now each within BURST_GAP_S of the next, the last within it of now, latest first."""
    sweep: list[Waiting] = []
    last = now
    for job in sorted(recent, key=lambda w: w.order[2], reverse=True):
        if job.order[2] > now:
            continue
        if last - job.order[2] > BURST_GAP_S:
            break
        sweep.append(job)
        last = job.order[2]
    return sweep


def expected_copy(sweep: Sequence[Waiting], n: int, at: float) -> Waiting:
    """The sweep's n-th expected job: a copy of its jobs so far in turn (latest first), submitted at `at`, with
    an id of its own."""
    job = sweep[n % len(sweep)]
    priority, score, _, job_id = job.order
    return replace(job, order=(priority, score, at, -1 - job_id - n * 10**7), fixed_start=None, expected=True)


def sweep_count_model(starts: Starts) -> ArrivalModel:
    """The true times of the rest of the sweep going on, each a copy of one of its jobs so far (latest first, in
    turn): what a sweep that declared only how many jobs it has would tell."""
    times = sorted({submitted for submitted, _, _ in starts.values()})

    def model(now: float, recent: Iterable[Waiting], aging_s: float = 0.0) -> list[tuple[float, Waiting]]:
        sweep = sweep_going_on(now, recent)
        expected: list[tuple[float, Waiting]] = []
        previous = now
        for at in times[bisect.bisect_right(times, now):]:
            if not sweep or at - previous > BURST_GAP_S:
                break
            expected.append((at, expected_copy(sweep, len(expected), at)))
            previous = at
        return expected

    return model


def sweep_sizes(starts: Starts) -> dict[float, int]:
    """Each submission time -> how many jobs its whole sweep has (submissions each within BURST_GAP_S of the
    one before): the size a sweep would declare."""
    times = sorted(submitted for submitted, _, _ in starts.values())
    sizes: dict[float, int] = {}
    first = 0
    for i in range(1, len(times) + 1):
        if i == len(times) or times[i] - times[i - 1] > BURST_GAP_S:
            for at in times[first:i]:
                sizes[at] = i - first
            first = i
    return sizes


def sweep_size_model(starts: Starts) -> ArrivalModel:
    """The rest of the sweep going on, as its declared size tells it: size - jobs so far, each a copy of one of
    its jobs so far (latest first, in turn), expected at the sweep's pace so far (its first to now over the
    jobs so far), the first one pace after now."""
    sizes = sweep_sizes(starts)

    def model(now: float, recent: Iterable[Waiting], aging_s: float = 0.0) -> list[tuple[float, Waiting]]:
        sweep = sweep_going_on(now, recent)
        if not sweep:
            return []
        left = sizes.get(sweep[0].order[2], 0) - len(sweep)
        pace = (now - sweep[-1].order[2]) / len(sweep)
        expected: list[tuple[float, Waiting]] = []
        for n in range(max(0, left)):
            at = now + (n + 1) * pace
            expected.append((at, expected_copy(sweep, n, at)))
        return expected

    return model


def relative_errors(starts: Starts, estimates: Mapping[int, float | None]) -> list[float]:
    errors = []
    for job_id, (submitted, start, waited) in starts.items():
        if not waited or start is None or start <= submitted:
            continue
        estimate = estimates.get(job_id)
        errors.append(math.inf if estimate is None else abs(estimate - start) / (start - submitted))
    return errors


def horizon_class(wait_s: float) -> int:
    return min(8, int(math.log2(1 + wait_s / 600)))


def calibrated(starts: Starts, estimates: Mapping[int, float | None]) -> dict[int, float | None]:
    """Each estimated wait scaled by the median real / estimated wait of its class's last jobs known then."""
    told = sorted(
        (submitted, job_id, estimate)
        for job_id, (submitted, _, waited) in starts.items()
        if waited and (estimate := estimates.get(job_id)) is not None and estimate > submitted
    )
    scaled: dict[int, float | None] = dict(estimates)
    for submitted, job_id, estimate in told:
        wait = estimate - submitted
        ratios = []  # (known at, real / estimated wait)
        for other_submitted, other, other_estimate in told:
            if other_submitted >= submitted:
                break
            other_wait = other_estimate - other_submitted
            if horizon_class(other_wait) != horizon_class(wait):
                continue
            start = starts[other][1]
            if start is not None and start <= submitted:
                ratios.append((start, (start - other_submitted) / other_wait))
            elif other_estimate < submitted:
                ratios.append((submitted, (submitted - other_submitted) / other_wait))
        latest = [r for _, r in sorted(ratios)[-CALIBRATION_WINDOW:]]
        if len(latest) >= CALIBRATION_MIN:
            scaled[job_id] = submitted + wait * statistics.median(latest)
    return scaled


def figures(errors: Sequence[float]) -> str:
    within = sum(1 for e in errors if e <= 0.25) / len(errors)
    return f"median error {statistics.median(errors):.3f} of the wait, {100 * within:.0f}% within 25% ({len(errors)} waited)"


def evaluate(path: Path, models: list[str], calibrate: bool, true_runtimes_of: str | None = None,
             traces_dir: Path | None = None) -> None:
    instants, starts = pickle.loads(path.read_bytes())
    if true_runtimes_of is not None:
        with true_runtimes(true_runtimes_of, traces_dir or REPO.parent / "shared" / "traces"):
            _evaluate(path, instants, starts, models, calibrate, " (true run times)")
    else:
        _evaluate(path, instants, starts, models, calibrate, "")


def _evaluate(path: Path, instants: Instants, starts: Starts, models: list[str], calibrate: bool, label: str) -> None:
    for name in models:
        model: ArrivalModel
        if name == "current":
            model = expected_arrivals
        elif name == "none":
            model = no_arrivals
        elif name in ("oracle", "sweep"):
            model = oracle_model(instants, sweep_only=name == "sweep")
        elif name.startswith("window"):
            # window-H (hours), window-H+burst, window-H/N (every N-th)
            spec, _, every = name.removeprefix("window-").partition("/")
            hours, _, burst = spec.partition("+")
            model = window_model(instants, float(hours) * 3600, burst == "burst", int(every or 1))
        elif name == "sweep-count":
            model = sweep_count_model(starts)
        elif name == "sweep-size":
            model = sweep_size_model(starts)
        else:
            raise SystemExit(
                f"unknown arrival model {name!r}: current, none, oracle, sweep, sweep-count or sweep-size"
            )
        estimates = estimates_with(instants, model)
        print(f"{path.name} {name}{label}: {figures(relative_errors(starts, estimates))}", flush=True)
        if calibrate:
            print(f"{path.name} {name} calibrated: {figures(relative_errors(starts, calibrated(starts, estimates)))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    take = commands.add_parser("capture")
    take.add_argument("--trace", default="trace4")
    take.add_argument("--declarations", default="exact")
    take.add_argument("--traces-dir", type=Path, default=REPO.parent / "shared" / "traces")
    take.add_argument("--out", type=Path, required=True)
    score = commands.add_parser("evaluate")
    score.add_argument("captured", type=Path)
    score.add_argument("--models", default="current")
    score.add_argument("--calibrate", action="store_true")
    score.add_argument("--true-runtimes", metavar="TRACE",
                       help="the replay knows every job's true run time, from this trace (the one captured)")
    score.add_argument("--traces-dir", type=Path, default=REPO.parent / "shared" / "traces")
    args = parser.parse_args(argv)
    if args.command == "capture":
        capture(args.trace, args.declarations, args.traces_dir, args.out)
    else:
        evaluate(args.captured, [m for m in args.models.split(",") if m], args.calibrate, args.true_runtimes,
                 args.traces_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
