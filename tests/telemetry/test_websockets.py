"""The websockets through Channels' communicator, against the real ASGI application."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from apps.accounts.models import Membership
from apps.accounts.services import membership_remove
from apps.jobs import services as job_services
from apps.telemetry.hub import hub
from console.asgi import application
from tests.telemetry.conftest import gpu_sample
from tests.telemetry.test_ingest_and_alerts import run_job_on_sim, send

# Committed data: consumers reach the database through database_sync_to_async, which closes connections between
# calls (on PostgreSQL that would end a test wrapped in one transaction).
pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = b"http://localhost"


def cookie_for(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def headers(user=None, origin: bytes | None = ORIGIN) -> list[tuple[bytes, bytes]]:
    found = []
    if origin is not None:
        found += [(b"origin", origin), (b"host", b"localhost")]  # a browser on the console's own page
    if user is not None:
        found.append((b"cookie", cookie_for(user)))
    return found


async def open_socket(path: str, hdrs) -> tuple[WebsocketCommunicator, bool, int | None]:
    socket = WebsocketCommunicator(application, path, headers=hdrs)
    connected, code = await socket.connect(timeout=30)
    return socket, connected, code


async def next_of(socket: WebsocketCommunicator, kind: str, timeout: float = 30.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        message = json.loads(await socket.receive_from(timeout=max(remaining, 0.01)))
        if message["type"] == kind:
            return message


def refused(path: str, hdrs) -> int | None:
    async def run():
        socket, connected, code = await open_socket(path, hdrs)
        await socket.disconnect()
        return None if connected else code

    return async_to_sync(run)()


def test_anonymous_foreign_origin_and_cookie_without_origin_are_refused(world, sim_host):
    assert refused("/ws/cluster/", headers()) == 4401
    assert refused("/ws/cluster/", headers(world.member, origin=b"https://evil.example")) == 4403
    assert refused("/ws/cluster/", headers(world.member, origin=None)) == 4401
    assert refused("/ws/cluster/", headers(world.noteam)) == 4403


def test_ticket_opens_one_socket_once(world, sim_host, client_for):
    ticket = client_for(world.member).post("/api/v1/ws-ticket/").json()["ticket"]
    assert APIClient().post("/api/v1/ws-ticket/").status_code == 401

    async def run():
        socket, connected, _ = await open_socket(f"/ws/cluster/?ticket={ticket}", [])
        assert connected
        await socket.disconnect()
        again, connected_again, code = await open_socket(f"/ws/cluster/?ticket={ticket}", [])
        assert not connected_again and code == 4401

    async_to_sync(run)()


def test_cluster_stream_hides_other_teams_jobs(world, sim_host):
    _, agent = sim_host
    job = run_job_on_sim(world)
    send(agent, [gpu_sample(0, util=91.0), gpu_sample(1, util=3.0)])

    viewer_headers, other_headers = headers(world.viewer), headers(world.other)

    async def run():
        mine, _, _ = await open_socket("/ws/cluster/", viewer_headers)
        theirs, _, _ = await open_socket("/ws/cluster/", other_headers)
        seen = await next_of(mine, "gpu.sample")
        other = await next_of(theirs, "gpu.sample")
        await mine.disconnect()
        await theirs.disconnect()
        return seen, other

    seen, other = async_to_sync(run)()
    busy = next(g for g in seen["gpus"] if g["host"] == "sim-t" and g["index"] == 0)
    assert busy["job"] == job.pk and busy["team"] == "vision" and busy["utilization_pct"] == 91.0
    assert busy["simulated"] is True and isinstance(busy["ts"], float)
    hidden = next(g for g in other["gpus"] if g["host"] == "sim-t" and g["index"] == 0)
    assert hidden["job"] is None and hidden["team"] is None and hidden["other_team"] is True
    assert all(g["job"] != job.pk for g in other["gpus"])
    assert not hub.subscribers


def test_job_stream_state_log_and_refusal(world, sim_host):
    _, agent = sim_host
    job = run_job_on_sim(world)
    assert refused(f"/ws/jobs/{job.pk}/", headers(world.other)) == 4404
    assert refused("/ws/jobs/999999/", headers(world.admin)) == 4404

    member_headers = headers(world.member)

    async def run():
        socket, connected, _ = await open_socket(f"/ws/jobs/{job.pk}/", member_headers)
        assert connected
        first = await next_of(socket, "job.state")
        from asgiref.sync import sync_to_async

        def report():
            from apps.cluster.models import Host
            from workers.protocol import JobStatus

            sim = Host.objects.get(name="sim-t")
            job_services.job_report_status(host=sim, job_id=job.pk, status=JobStatus("running", 1))
            job_services.job_append_log(host=sim, job_id=job.pk, attempt=1, data="epoch 1 loss 0.5\n")

        await sync_to_async(report)()
        got: dict[str, dict] = {}
        while {"job.log", "job.state"} - set(got):
            message = json.loads(await socket.receive_from(timeout=30))
            if message["type"] in {"job.log", "job.state"}:
                got[message["type"]] = message
        log, state = got["job.log"], got["job.state"]
        await sync_to_async(send)(agent, [gpu_sample(0, util=66.0)])
        sample = await next_of(socket, "gpu.sample")
        while not sample["gpus"]:
            sample = await next_of(socket, "gpu.sample")
        await socket.disconnect()
        return first, log, state, sample

    first, log, state, sample = async_to_sync(run)()
    assert first["job"]["id"] == job.pk and first["job"]["state"] == "placed"
    assert log == {"type": "job.log", "offset": 0, "data": "epoch 1 loss 0.5\n"}
    assert state["job"]["state"] == "running"
    assert [g["utilization_pct"] for g in sample["gpus"]] == [66.0]


def test_removing_access_closes_the_socket(world, sim_host):
    job = run_job_on_sim(world)

    viewer_headers = headers(world.viewer)

    async def run():
        socket, connected, _ = await open_socket(f"/ws/jobs/{job.pk}/", viewer_headers)
        assert connected
        await next_of(socket, "job.state")
        from asgiref.sync import sync_to_async

        def remove():
            membership_remove(membership=Membership.objects.get(team=world.vision, user=world.viewer),
                              actor=world.admin)

        await sync_to_async(remove)()
        while True:
            output = await socket.receive_output(timeout=30)
            if output["type"] == "websocket.close":
                return output["code"]

    assert async_to_sync(run)() == 4403


def test_a_silent_hosts_gpus_turn_stale_in_the_cluster_stream_and_the_counters_add_up(world, sim_host, settings):
    """The bug: a dead host's last frame went on being pushed every second as live (utilization, job, health)."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.cluster.models import Host

    host, agent = sim_host
    job = run_job_on_sim(world)  # node-a and node-b are marked down
    send(agent, [gpu_sample(0, util=91.0), gpu_sample(1, util=3.0)])
    member_headers = headers(world.member)

    def sim_gpus(frame: dict) -> list[dict]:
        return [g for g in frame["gpus"] if g["host"] == "sim-t"]

    async def run():
        from asgiref.sync import sync_to_async

        socket, connected, _ = await open_socket("/ws/cluster/", member_headers)
        assert connected
        live = await next_of(socket, "gpu.sample")
        await sync_to_async(Host.objects.filter(pk=host.pk).update)(
            last_heartbeat=timezone.now() - timedelta(seconds=settings.HEARTBEAT_TIMEOUT_S + 1))
        stale = await next_of(socket, "gpu.sample")
        while not all(g["stale"] for g in sim_gpus(stale)):
            stale = await next_of(socket, "gpu.sample")
        await socket.disconnect()
        return live, stale

    live, stale = async_to_sync(run)()
    busy = sim_gpus(live)[0]
    assert busy["stale"] is False and busy["utilization_pct"] == 91.0 and busy["job"] == job.pk
    assert live["counts"]["gpus"] == {"busy": 1, "idle": 1, "stale": 0, "down": 16}
    assert live["counts"]["hosts"] == {"up": 1, "draining": 0, "stale": 0, "down": 2}
    for gpu in sim_gpus(stale):
        assert gpu["host_status"] == "stale" and gpu["utilization_pct"] is None and gpu["temperature_c"] is None
        assert gpu["job"] is None and gpu["jobs"] == [] and gpu["health"] is None and gpu["last_seen"] is not None
    assert stale["counts"]["gpus"] == {"busy": 0, "idle": 0, "stale": 2, "down": 16}
    assert stale["counts"]["hosts"] == {"up": 0, "draining": 0, "stale": 1, "down": 2}
    assert {h["name"]: h["status"] for h in stale["hosts"]}["sim-t"] == "stale"
    assert len(stale["gpus"]) == sum(stale["counts"]["gpus"].values()) == 18
