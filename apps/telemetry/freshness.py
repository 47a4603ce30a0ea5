"""How much of what the console shows of a host is live: the one rule the live frames and the pages share.

A host is `down` when the reaper marked it so, `stale` when it is not marked down (yet) but its last heartbeat
or its last telemetry frame is older than the heartbeat timeout (`settings.HEARTBEAT_TIMEOUT_S`), else `up` (or
`draining`). The GPUs of a down or stale host are stale: their entries carry `stale: true` and no reading, job
or health claim, since nothing live backs them. Counters add up: every host is up, draining, stale or down;
every GPU is busy, idle, stale or down.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings

from apps.cluster.models import GPU, Host

FRAME_READINGS = (
    "utilization_pct",
    "memory_used_mb",
    "memory_total_mb",
    "memory_bandwidth_pct",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "fan_pct",
    "ecc_errors_volatile",
)


@dataclass(frozen=True)
class HostFacts:
    """What the records say of a host and its GPUs: (index, uuid, gpu type, health) each."""

    name: str
    state: str
    simulated: bool
    last_heartbeat: datetime | None
    gpus: tuple[tuple[int, str, str, str], ...] = ()


def host_facts() -> list[HostFacts]:
    """Every host with its GPUs, in two queries (the caller restricts to what its viewer may see)."""
    gpus: dict[int, list[tuple[int, str, str, str]]] = {}
    for host_id, index, uuid, gpu_type, health in GPU.objects.order_by("host_id", "index").values_list(
        "host_id", "index", "uuid", "gpu_type", "health"
    ):
        gpus.setdefault(host_id, []).append((index, uuid, gpu_type, health))
    return [
        HostFacts(name, state, simulated, last, tuple(gpus.get(pk, ())))
        for pk, name, state, simulated, last in Host.objects.order_by("name").values_list(
            "pk", "name", "state", "simulated", "last_heartbeat"
        )
    ]


def host_status(state: str, last_heartbeat: datetime | None, frame: dict[str, Any] | None, now: float) -> str:
    """up, draining, stale or down (see the module's docstring). `now` is a UNIX time."""
    if state == Host.State.DOWN:
        return "down"
    timeout = settings.HEARTBEAT_TIMEOUT_S
    if last_heartbeat is None or now - last_heartbeat.timestamp() > timeout:
        return "stale"
    if frame is not None and now - float(frame.get("received", 0.0)) > timeout:
        return "stale"  # heartbeats, but its telemetry stopped: the last frame is old news
    return "draining" if state == Host.State.DRAINING else "up"


def stale_gpu(
    host: HostFacts, index: int, uuid: str, gpu_type: str, status: str, frame: dict[str, Any] | None
) -> dict[str, Any]:
    """A GPU entry of a down or stale host: who it is, since when nothing live was heard, no claim."""
    return {
        "host": host.name,
        "index": index,
        "uuid": uuid,
        "gpu_type": gpu_type,
        "simulated": host.simulated,
        "stale": True,
        "host_status": status,
        "last_seen": frame.get("received") if frame else None,
        "available": None,
        "health": None,
        "job": None,
        "team": None,
        "jobs": [],
        "ts": None,
        **dict.fromkeys(FRAME_READINGS),
        "throttle_reasons": [],
        "error": None,
        "processes": [],
    }


@dataclass
class ClusterView:
    """The cluster as the live stream shows it: hosts with their status, and one entry for every GPU."""

    hosts: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)

    def host_counts(self) -> dict[str, int]:
        counts = Counter(host["status"] for host in self.hosts)
        return {status: counts.get(status, 0) for status in ("up", "draining", "stale", "down")}


def cluster_view(hosts: list[HostFacts], frames: dict[str, dict[str, Any]], now: float) -> ClusterView:
    """Hosts and GPU entries from the records and the latest frames (by host name): the frame's entries for a host
    that is up or draining, stale ones for every GPU of a host that is down or stale."""
    view = ClusterView()
    for host in hosts:
        frame = frames.get(host.name)
        status = host_status(host.state, host.last_heartbeat, frame, now)
        view.hosts.append(
            {
                "name": host.name,
                "state": host.state,
                "status": status,
                "last_heartbeat": host.last_heartbeat.timestamp() if host.last_heartbeat else None,
            }
        )
        live = (
            {g["uuid"]: g for g in frame["gpus"]}
            if frame is not None and status in ("up", "draining")
            else {}
        )
        for index, uuid, gpu_type, _health in host.gpus:
            entry = live.get(uuid)
            # A GPU its live host has sent no sample of yet (just registered) is stale too: nothing backs it.
            view.gpus.append(
                {**entry, "stale": False, "host_status": status}
                if entry is not None
                else stale_gpu(host, index, uuid, gpu_type, status, frame)
            )
    return view


def gpu_status(entry: dict[str, Any]) -> str:
    """busy, idle, stale or down, for a GPU entry (as a viewer sees it: `other_team` counts as busy)."""
    if (
        entry.get("host_status") == "down"
        or entry.get("health") == GPU.Health.FAULTY
        or entry.get("available") is False
    ):
        return "down"
    if entry.get("stale"):
        return "stale"
    return "busy" if entry.get("job") or entry.get("other_team") else "idle"
