from __future__ import annotations

import time

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from apps.cluster.services import host_token_issue
from apps.telemetry import alerts, services
from tests.cluster.test_agent_api import registration


@pytest.fixture(autouse=True)
def clean_live_state():
    cache.clear()
    services.forget_host_maps()
    services.accumulator.take_closed(0, everything=True)
    services.accumulator.last_ts.clear()
    alerts.rules.loaded_at = 0.0
    yield
    cache.clear()


@pytest.fixture
def sim_host(world):
    """A registered agent host with 2 simulated H200s; returns (host, agent API client)."""
    host, secret = host_token_issue(name="sim-t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Host {secret}")
    assert client.post("/api/v1/agent/register/", registration("sim-t"), format="json").status_code == 200
    host.refresh_from_db()
    return host, client


def gpu_sample(index: int, *, ts: float | None = None, util: float = 50.0, temp: int = 50, mem: int = 1000,
               available: bool = True, host: str = "sim-t") -> dict:
    return {"index": index, "uuid": f"GPU-sim-{host}-{index}", "ts": ts or time.time(), "available": available,
            "utilization_pct": util if available else None, "memory_used_mb": mem if available else None,
            "memory_total_mb": 143771 if available else None, "memory_bandwidth_pct": 10.0,
            "temperature_c": temp if available else None, "power_w": 300.0 if available else None,
            "power_limit_w": 700.0, "sm_clock_mhz": 1980, "fan_pct": None, "throttle_reasons": [],
            "ecc_errors_volatile": 0, "processes": [], "error": None if available else "GPU is lost"}
