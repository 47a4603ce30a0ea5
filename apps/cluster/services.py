"""Hosts: credentials, registration by the agent, heartbeats and liveness."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from apps.accounts import tokens
from apps.cluster.models import GPU, Host, HostCredential
from apps.core.errors import WrongState
from apps.core.models import AuditEvent
from apps.core.services import audit_record
from apps.scheduling.placeability import gpu_type_key
from workers.protocol import (
    CONTAINER_RUNTIMES,
    PROTOCOL_VERSION,
    ImageRecord,
    valid_address,
)


class RegistrationError(WrongState, ValueError):
    """The registration conflicts with what the console knows (another protocol, another host's name): 409."""


def host_token_issue(*, name: str, actor: AbstractBaseUser | None = None) -> tuple[Host, str]:
    """Create the host if needed and give it a new token (the old one stops working). Returns the secret."""
    secret = tokens.new_secret("gph")
    with transaction.atomic():
        host, _ = Host.objects.get_or_create(name=name)
        HostCredential.objects.update_or_create(
            host=host, defaults={"digest": tokens.digest(secret), "prefix": secret[:12]}
        )
        audit_record(AuditEvent.Action.HOST_TOKEN_CREATED, actor=actor, target=f"host {name}")
    return host, secret


def host_authenticate(secret: str) -> Host | None:
    credential = HostCredential.objects.select_related("host").filter(digest=tokens.digest(secret)).first()
    return credential.host if credential else None


def host_register(host: Host, registration: dict) -> Host:
    """Record what the agent found on its host: versions and GPUs. GPUs are matched by index."""
    if registration.get("protocol") != PROTOCOL_VERSION:
        raise RegistrationError(
            f"agent speaks protocol {registration.get('protocol')!r}, the console speaks {PROTOCOL_VERSION}: "
            "upgrade the agent or the console so they match"
        )
    if registration.get("host") != host.name:
        raise RegistrationError(f"this token belongs to host {host.name!r}, not {registration.get('host')!r}")
    address = str(registration.get("address", ""))
    if address and not (len(address) <= 200 and valid_address(address)):
        raise RegistrationError(f"address {address!r} is neither an IP address nor a host name")
    uuids = [gpu["uuid"] for gpu in registration.get("gpus", [])]
    if len(set(uuids)) != len(uuids):
        raise RegistrationError("two GPUs of the registration have the same UUID")
    # A host speaks for its own GPUs only: a UUID another host registered stays that host's (it was a 500).
    elsewhere = GPU.objects.filter(uuid__in=uuids).exclude(host=host).select_related("host").first()
    if elsewhere is not None:
        raise RegistrationError(f"GPU {elsewhere.uuid} is registered on host {elsewhere.host.name!r}; an admin "
                                "removes it there first if it really moved")
    now = timezone.now()
    with transaction.atomic():
        host = Host.objects.select_for_update().get(pk=host.pk)
        host.agent_version = str(registration.get("agent_version", ""))[:40]
        host.driver_version = str(registration.get("driver_version", ""))[:40]
        host.cuda_version = str(registration.get("cuda_version", ""))[:40]
        host.simulated = bool(registration.get("simulated"))
        host.address = address
        host.cpus, host.memory_mb = _capacity(registration)
        host.runtime = runtime_of(registration)
        host.job_isolation = registration.get("job_isolation") or ""
        host.cached_images = images_of(registration.get("images"))
        host.last_heartbeat = now
        if host.state == Host.State.DOWN:
            host.state = Host.State.DRAINING if host.drain else Host.State.UP
        host.save()
        seen = set()
        for gpu in registration.get("gpus", []):
            seen.add(gpu["index"])
            GPU.objects.update_or_create(
                host=host,
                index=gpu["index"],
                defaults={
                    "uuid": gpu["uuid"],
                    "gpu_type": gpu_type_key(gpu["gpu_type"]),
                    "model_name": gpu.get("name", "")[:120],
                    "memory_mb": gpu["memory_mb"],
                },
            )
        # GPUs that disappeared from the host stay as records (jobs refer to them) but take no new work.
        GPU.objects.filter(host=host).exclude(index__in=seen).update(
            health=GPU.Health.FAULTY, health_reason="not reported by the agent at its last registration"
        )
    return host


def runtime_of(registration: dict) -> str:
    """The agent's job backend; "process" for an older agent that does not say (or says something unknown)."""
    runtime = registration.get("runtime")
    return runtime if runtime in CONTAINER_RUNTIMES else "process"


def images_of(message: object) -> list[dict]:
    """A container host's cached images as stored on the Host (ImageRecord's fields); malformed entries dropped."""
    return [asdict(record) for record in ImageRecord.decode_list(message)]


def host_set_images(host: Host, message: object) -> None:
    """Record the images a heartbeat reported (the same shape as the registration's `images`)."""
    Host.objects.filter(pk=host.pk).update(cached_images=images_of(message))


def _capacity(registration: dict) -> tuple[int, int]:
    """The host's CPUs and memory (MiB) as the agent reported them; 0 for what it did not (older agents)."""
    values = []
    for name, top in (("cpus", 1 << 20), ("memory_mb", 1 << 40)):
        value = registration.get(name, 0)
        values.append(value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top else 0)
    return values[0], values[1]


def host_heartbeat(host: Host) -> bool:
    """Record a heartbeat. Returns True when the host came back up from down."""
    now = timezone.now()
    Host.objects.filter(pk=host.pk).update(last_heartbeat=now)
    back = Host.State.DRAINING if Host.objects.filter(pk=host.pk, drain=True).exists() else Host.State.UP
    return bool(Host.objects.filter(pk=host.pk, state=Host.State.DOWN).update(state=back))


def host_set_draining(
    host: Host, draining: bool, *, actor: AbstractBaseUser | None, request: HttpRequest | None = None
) -> None:
    """Draining: no new jobs land on the host (running ones finish or are moved); it survives restarts. Audited."""
    state = Host.State.DRAINING if draining else Host.State.UP
    with transaction.atomic():
        changed = Host.objects.filter(pk=host.pk).exclude(drain=draining).update(drain=draining)
        Host.objects.filter(pk=host.pk).exclude(state=Host.State.DOWN).update(state=state)
        if changed:
            audit_record(AuditEvent.Action.HOST_DRAIN, actor=actor, target=f"host {host.name}", request=request,
                         draining=draining)


def hosts_mark_lost(now=None) -> list[Host]:
    """Mark down every host whose heartbeats stopped; returns the hosts this call marked."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.HEARTBEAT_TIMEOUT_S)
    lost = []
    for host in Host.objects.filter(state__in=[Host.State.UP, Host.State.DRAINING], last_heartbeat__lt=cutoff):
        if Host.objects.filter(pk=host.pk, state=host.state, last_heartbeat__lt=cutoff).update(state=Host.State.DOWN):
            lost.append(host)
    return lost
