"""A host's job backend and cached images: the agent registers them, the host API shows them."""

from __future__ import annotations

from rest_framework.test import APIClient

from apps.cluster.models import Host
from apps.cluster.services import host_set_images, host_token_issue
from workers.protocol import PROTOCOL_VERSION, GpuRecord, ImageRecord, Registration

IMAGE = ImageRecord(name="localhost/torch:2.13", id="sha256:" + "a" * 64, size_mb=4120,
                    created="2026-12-02T10:00:00Z")


def register(secret: str, message: dict) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Host {secret}")
    return client.post("/api/v1/agent/register/", message, format="json").status_code


def registration(**extra) -> dict:
    gpus = [GpuRecord(index=0, uuid="GPU-c-0", name="NVIDIA H200", gpu_type="H200", memory_mb=143771)]
    return {**Registration(host="node-c", agent_version="0.2.0", simulated=False, gpus=gpus, **extra).to_message(),
            "protocol": PROTOCOL_VERSION}


def test_a_container_host_registers_its_runtime_and_images_and_the_api_shows_them(world, client_for):
    _, secret = host_token_issue(name="node-c")
    junk = [{"name": 3}, "x", {"id": "only-an-id"}]
    message = registration(runtime="podman", images=[IMAGE])
    message["images"] += junk
    assert register(secret, message) == 200
    host = Host.objects.get(name="node-c")
    assert host.runtime == "podman"
    assert ImageRecord.decode_list(host.cached_images) == [IMAGE]
    shown = client_for(world.member).get("/api/v1/hosts/node-c/").json()
    assert shown["runtime"] == "podman"
    assert shown["cached_images"] == [{"name": IMAGE.name, "id": IMAGE.id, "size_mb": 4120,
                                       "created": "2026-12-02T10:00:00Z"}]
    host_set_images(host, [])
    assert Host.objects.get(pk=host.pk).cached_images == []


def test_an_older_agent_is_a_process_host_and_an_unknown_runtime_is_a_400(world):
    _, secret = host_token_issue(name="node-c")
    message = registration()
    del message["runtime"], message["images"]
    assert register(secret, message) == 200
    assert Host.objects.get(name="node-c").runtime == "process"
    assert register(secret, registration(runtime="lxc")) == 400
    assert register(secret, {**registration(), "images": "nope"}) == 400


def test_a_host_registers_how_it_keeps_process_jobs_apart(world, client_for):
    _, secret = host_token_issue(name="node-c")
    assert register(secret, registration(job_isolation="own-uid")) == 200
    assert Host.objects.get(name="node-c").job_isolation == "own-uid"
    assert client_for(world.member).get("/api/v1/hosts/node-c/").json()["job_isolation"] == "own-uid"
    older = registration()
    del older["job_isolation"]
    assert register(secret, older) == 200  # an agent that does not say: not own-uid
    assert Host.objects.get(name="node-c").job_isolation == ""
    assert register(secret, registration(job_isolation="root")) == 400
