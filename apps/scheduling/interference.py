"""How much slower jobs run when they share one GPU (the simulator's interference model).

The Muri traces give, per iteration of a job, its iteration time t and the time it spends on each of three
resources r_0..r_2 (data loading / CPU, GPU compute, network; they add up to a little less than t). Jobs sharing
a GPU are modelled as interleaving in joint rounds, one iteration of each job per round (as Muri's interleaving
does): in a round each resource serves every job in turn, and no job goes faster than alone, so

    round = max( max over resources k of sum over jobs j of r_jk ,  max over jobs j of t_j )

and job j's slowdown is round / t_j (its throughput falls by that factor). Jobs with complementary profiles (one
bound on data loading, one on GPU compute, with similar iteration times) lose little; two jobs bound on the same
resource each run about twice as slow. A job without resource times counts as busy on one resource for its whole
iteration (plain time slicing). A context-switch overhead per round can be added (`switch_overhead`, a fraction
of the round per extra job; 0 by default).
"""

from __future__ import annotations

from collections.abc import Sequence

# (iteration seconds, per-resource seconds per iteration)
Profile = tuple[float, tuple[float, ...]]


def round_s(profiles: Sequence[Profile], switch_overhead: float = 0.0) -> float:
    """Length of one joint round (one iteration of every job) of jobs sharing a GPU."""
    if not profiles:
        return 0.0
    width = max(len(resources) for _, resources in profiles)
    busiest = max(
        sum(resources[k] if k < len(resources) else 0.0 for _, resources in profiles) for k in range(width)
    )
    joint = max(busiest, max(t for t, _ in profiles))
    return joint * (1.0 + switch_overhead * (len(profiles) - 1))


def slowdowns(profiles: Sequence[Profile], switch_overhead: float = 0.0) -> list[float]:
    """Each job's run-time multiplier when these jobs share one GPU (1.0 for a job alone)."""
    if len(profiles) <= 1:
        return [1.0] * len(profiles)
    joint = round_s(profiles, switch_overhead)
    return [joint / t if t > 0 else 1.0 for t, _ in profiles]


def profile(step_s: float | None, resource_s: tuple[float, ...] | None) -> Profile:
    """A trace job's profile; without a step time it is one second on one resource (pure time slicing)."""
    step = step_s or 1.0
    return step, resource_s if resource_s else (step,)
