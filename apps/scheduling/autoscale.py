"""How many replicas an inference service should run, from what its replicas measured (pure arithmetic).

The rule has hysteresis, as Kubernetes' HPA has (a scale-down stabilization window) and Knative's autoscaler has
(a panic window only with enough traffic):
- No decision on thin or stale figures: a latency or rate target counts only with at least `min_requests` in the
  replicas' latency windows and traffic still flowing (one cold request is not load, and a p95 left over from a
  burst at zero traffic is not either).
- A scale-up waits `up_cooldown_s` after the last change; while a replica it asked for is not ready yet, no new
  decision is taken in either direction.
- A scale-down waits until every replica is ready and `down_stabilization_s` have passed since the last change,
  then steps down one replica at a time (to the minimum at once only when there was no traffic at all).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScalingTargets:
    min_replicas: int
    max_replicas: int
    target_p95_ms: float | None
    target_rps_per_replica: float | None
    max_batch: int


@dataclass(frozen=True, slots=True)
class MeasuredLoad:
    live: int  # replicas started and not ended (ready or not)
    ready: int  # replicas that answered their stats call this pass
    rps: float  # requests per second over the replicas' recent window, summed
    window_requests: int  # requests in the replicas' latency windows, summed
    p95_ms: float | None  # the worst replica's p95 over its latency window
    queue_depth: int


@dataclass(frozen=True, slots=True)
class ScalingRules:
    up_cooldown_s: float = 15.0
    down_stabilization_s: float = 60.0
    min_requests: int = 20
    idle_rps: float = 0.05
    # A replica's latency is calm below this share of the target, and its rate below this share.
    calm_share: float = 0.5
    calm_rate_share: float = 0.7
    deep_queue_batches: int = 4


DEFAULT_RULES = ScalingRules()


def decide_replicas(
    current: int, targets: ScalingTargets, load: MeasuredLoad, since_last_change_s: float,
    rules: ScalingRules = DEFAULT_RULES,
) -> tuple[int, str]:
    """The replica count to run now and why (the reason is shown in the service's events)."""
    bounded = min(max(current, targets.min_replicas), targets.max_replicas)
    if bounded != current:
        return bounded, "outside the min/max bounds"
    if load.ready < current:
        return current, f"waiting for {current - load.ready} replica(s) to be ready"
    if since_last_change_s < rules.up_cooldown_s:
        return current, "cooling down"
    # A p95 counts only while traffic still flows: a window's figures outlive the burst that made them.
    enough = load.window_requests >= rules.min_requests and load.rps >= rules.idle_rps
    per_replica = load.rps / max(load.ready, 1)
    over_latency = (enough and targets.target_p95_ms is not None and load.p95_ms is not None
                    and load.p95_ms > targets.target_p95_ms)
    over_rate = enough and targets.target_rps_per_replica is not None and per_replica > targets.target_rps_per_replica
    deep_queue = load.queue_depth > rules.deep_queue_batches * targets.max_batch
    if (over_latency or over_rate or deep_queue) and current < targets.max_replicas:
        if over_latency:
            why = f"p95 {load.p95_ms:.0f} ms > target {targets.target_p95_ms:.0f} ms"
        elif over_rate:
            why = f"{per_replica:.1f} req/s per replica > target {targets.target_rps_per_replica:.1f}"
        else:
            why = f"queue depth {load.queue_depth}"
        return current + 1, f"{why} over {load.window_requests} recent requests"
    if current <= targets.min_replicas or since_last_change_s < rules.down_stabilization_s:
        return current, "steady"
    if load.rps < rules.idle_rps and load.queue_depth == 0:
        return targets.min_replicas, f"idle ({load.rps:.2f} req/s): back to the minimum"
    fewer = current - 1
    calm_latency = targets.target_p95_ms is None or (
        load.p95_ms is not None and load.p95_ms < targets.target_p95_ms * rules.calm_share)
    calm_rate = (targets.target_rps_per_replica is None
                 or load.rps / fewer < targets.target_rps_per_replica * rules.calm_rate_share)
    if calm_latency and calm_rate:
        return fewer, f"load fits {fewer} replica(s): {load.rps:.1f} req/s, p95 {load.p95_ms or 0:.0f} ms"
    return current, "steady"
