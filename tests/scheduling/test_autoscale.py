"""The autoscaler's rule: hysteresis, no decision on thin or stale figures, no scale-down before replicas are ready."""

from __future__ import annotations

import pytest

from apps.scheduling.autoscale import MeasuredLoad, ScalingTargets, decide_replicas

TARGETS = ScalingTargets(min_replicas=1, max_replicas=4, target_p95_ms=100.0, target_rps_per_replica=10.0,
                         max_batch=8)
LONG_AGO = 1e9


def load(*, live: int = 1, ready: int | None = None, rps: float = 0.0, window: int = 0, p95: float | None = None,
         queue: int = 0) -> MeasuredLoad:
    return MeasuredLoad(live=live, ready=live if ready is None else ready, rps=rps, window_requests=window,
                        p95_ms=p95, queue_depth=queue)


def test_one_cold_request_does_not_scale_up():
    assert decide_replicas(1, TARGETS, load(rps=0.1, window=1, p95=2500.0), LONG_AGO) == (1, "steady")


def test_a_stale_p95_at_zero_traffic_does_not_scale_up():
    # The latency window still holds a burst's slow requests, but nothing arrives any more.
    assert decide_replicas(1, TARGETS, load(rps=0.0, window=400, p95=900.0), LONG_AGO)[0] == 1


def test_sustained_slow_traffic_scales_up_one_replica_at_a_time():
    desired, reason = decide_replicas(1, TARGETS, load(rps=8.0, window=240, p95=400.0), LONG_AGO)
    assert desired == 2 and "p95 400 ms > target 100 ms over 240 recent requests" in reason


def test_rate_per_replica_over_target_scales_up():
    desired, reason = decide_replicas(2, TARGETS, load(live=2, rps=30.0, window=900, p95=50.0), LONG_AGO)
    assert desired == 3 and "15.0 req/s per replica > target 10.0" in reason


def test_a_deep_queue_scales_up_even_before_latencies_are_known():
    assert decide_replicas(1, TARGETS, load(rps=0.0, window=0, queue=40), LONG_AGO)[0] == 2


def test_no_decision_while_a_replica_asked_for_is_not_ready():
    busy = load(live=2, ready=1, rps=50.0, window=1500, p95=900.0)
    assert decide_replicas(2, TARGETS, busy, LONG_AGO) == (2, "waiting for 1 replica(s) to be ready")
    idle = load(live=2, ready=1)
    assert decide_replicas(2, TARGETS, idle, LONG_AGO)[0] == 2


def test_scale_down_waits_for_the_stabilization_window():
    idle = load(live=3)
    assert decide_replicas(3, TARGETS, idle, 30.0) == (3, "steady")
    desired, reason = decide_replicas(3, TARGETS, idle, 61.0)
    assert desired == 1 and reason.startswith("idle")


def test_calm_traffic_steps_down_one_replica():
    calm = load(live=3, rps=6.0, window=180, p95=20.0)
    assert decide_replicas(3, TARGETS, calm, 120.0)[0] == 2


def test_traffic_that_would_overload_fewer_replicas_keeps_them():
    assert decide_replicas(3, TARGETS, load(live=3, rps=18.0, window=540, p95=20.0), 120.0) == (3, "steady")


@pytest.mark.parametrize("current,expected", [(0, 1), (6, 4)])
def test_bounds_come_first(current, expected):
    assert decide_replicas(current, TARGETS, load(live=current), 0.0) == (expected, "outside the min/max bounds")


def test_scale_up_cools_down():
    hot = load(live=2, rps=50.0, window=1500, p95=900.0)
    assert decide_replicas(2, TARGETS, hot, 5.0) == (2, "cooling down")
    assert decide_replicas(4, TARGETS, load(live=4, rps=90.0, window=2000, p95=900.0), LONG_AGO) == (4, "steady")
