from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.accounts.models import Membership, Role, Team
from apps.cluster.models import GPU, Host
from apps.quotas.models import TeamQuota


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    password = factory.django.Password("pw-for-tests-123")


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)
        skip_postgeneration_save = True

    slug = factory.Sequence(lambda n: f"team{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())
    quota = factory.RelatedFactory("tests.factories.TeamQuotaFactory", factory_related_name="team")


class TeamQuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TeamQuota
        django_get_or_create = ("team",)

    max_gpus = 8


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    role = Role.MEMBER


class HostFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Host
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"gpu-host-{n}")
    state = Host.State.UP
    simulated = True
    last_heartbeat = factory.LazyFunction(timezone.now)  # up and heard from: not stale (telemetry/freshness.py)


def add_gpus(host: Host, count: int, gpu_type: str = "H200", memory_mb: int = 143_771) -> list[GPU]:
    return [
        GPU.objects.create(
            host=host, index=i, uuid=f"GPU-{host.name}-{i}", gpu_type=gpu_type, model_name=f"NVIDIA {gpu_type}",
            memory_mb=memory_mb,
        )
        for i in range(count)
    ]
