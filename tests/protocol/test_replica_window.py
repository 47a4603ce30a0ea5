"""A replica's /stats figures (workers.protocol.ReplicaWindow), shared by the built-in server and the replica gate."""

from __future__ import annotations

import numpy as np

from workers.protocol import REPLICA_LATENCY_WINDOW_S, ReplicaWindow


def test_percentiles_match_numpys_and_old_requests_leave_the_window():
    window = ReplicaWindow(started=0.0)
    latencies = [float(v) for v in np.random.default_rng(3).uniform(1, 500, 257)]
    for i, latency in enumerate(latencies):
        window.add(100.0 + i * 0.01, latency)
    figures = window.figures(now=103.0)
    expected = np.percentile(latencies, [50, 95, 99])
    assert [figures["latency_ms"][k] for k in ("p50", "p95", "p99")] == [round(float(v), 3) for v in expected]
    assert figures["window_requests"] == 257 and figures["rps"] == 25.7
    later = window.figures(now=103.0 + REPLICA_LATENCY_WINDOW_S)
    assert later["window_requests"] == 0 and later["latency_ms"] == {"p50": None, "p95": None, "p99": None}
    assert later["rps"] == 0.0


def test_one_request_is_its_own_percentiles():
    window = ReplicaWindow(started=0.0)
    window.add(1.0, 42.0)
    assert window.figures(now=1.5)["latency_ms"] == {"p50": 42.0, "p95": 42.0, "p99": 42.0}
