from __future__ import annotations

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Role, Team
from apps.cluster.models import GPU
from tests import fault_table, hang_watch, job_cgroups, module_cpu, module_seconds
from tests.factories import HostFactory, MembershipFactory, TeamFactory, UserFactory, add_gpus


@dataclass
class World:
    """Two teams on a 16-GPU cluster and one user for every persona the permission tests need."""

    vision: Team
    nlp: Team
    admin: object
    manager: object
    member: object
    member2: object
    viewer: object
    other: object
    noteam: object
    gpus: list[GPU]

    def persona(self, name: str):
        return None if name == "anonymous" else getattr(self, name)


@pytest.fixture(autouse=True)
def _caches_start_empty():
    """Each test starts with empty caches: a cached value (an alert condition's start, a host's GPU map, the alert
    rules) is keyed by row ids, which the next test's rows reuse after the rollback, so it would leak by the order
    tests run in."""
    from django.core.cache import cache

    from apps.telemetry import alerts
    from apps.telemetry import services as telemetry_services

    cache.clear()
    telemetry_services._maps.clear()
    telemetry_services.accumulator.take_closed(0.0, everything=True)  # another test's samples, by its GPU ids
    alerts.rules.loaded_at = 0.0  # the alert rules a process keeps for RULES_TTL_S: read afresh
    yield


# Rows that data migrations create: a transactional test's flush deletes them, and under pytest-xdist such a test
# can run before others in the same worker (serially, pytest-django runs transactional tests last).
SEEDING_MIGRATIONS = ["apps.telemetry.migrations.0002_default_alert_rules",
                      "apps.telemetry.migrations.0005_service_alert_rules"]


@pytest.fixture(autouse=True)
def _migration_rows_present(request):
    names = set(request.fixturenames)
    if not names & {"db", "transactional_db"} and not request.node.get_closest_marker("django_db"):
        yield
        return
    request.getfixturevalue("transactional_db" if "transactional_db" in names else "db")
    import importlib

    from django.apps import apps

    from apps.telemetry.models import AlertRule

    if not AlertRule.objects.exists():
        for module in SEEDING_MIGRATIONS:
            importlib.import_module(module).create_rules(apps, None)
    yield


@pytest.fixture
def world(db) -> World:
    vision = TeamFactory(slug="vision", quota__max_gpus=8)
    nlp = TeamFactory(slug="nlp", quota__max_gpus=8)
    admin = UserFactory(username="root-admin", is_staff=True, is_superuser=True)
    manager, member, member2, viewer, other, noteam = (
        UserFactory(username=name) for name in ("manny", "mia", "milo", "vic", "olga", "nobody")
    )
    MembershipFactory(team=vision, user=manager, role=Role.MANAGER)
    MembershipFactory(team=vision, user=member, role=Role.MEMBER)
    MembershipFactory(team=vision, user=member2, role=Role.MEMBER)
    MembershipFactory(team=vision, user=viewer, role=Role.VIEWER)
    MembershipFactory(team=nlp, user=other, role=Role.MEMBER)
    gpus = add_gpus(HostFactory(name="node-a"), 8) + add_gpus(HostFactory(name="node-b"), 8)
    return World(vision, nlp, admin, manager, member, member2, viewer, other, noteam, gpus)


@pytest.fixture
def client_for():
    def make(user) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make


def train_spec(**overrides) -> dict:
    spec = {"name": "resnet", "team": "vision", "gpus": 1, "workload": {"builtin": "mlp-digits"}}
    spec.update(overrides)
    return spec


@pytest.fixture
def fake_s3(monkeypatch):
    """An S3 endpoint in memory (moto) with the bucket `artifacts`, for the s3:// artifact store."""
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    with moto.mock_aws():
        boto3.client("s3").create_bucket(Bucket="artifacts")
        yield boto3.client("s3")


def pytest_sessionfinish(session, exitstatus) -> None:
    hang_watch.session_over(session, exitstatus)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its fault rows go to the controller
        workeroutput["fault_rows"] = list(fault_table.ROWS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    fault_table.ROWS.extend(tuple(row) for row in getattr(node, "workeroutput", {}).get("fault_rows", []))


def pytest_terminal_summary(terminalreporter) -> None:
    fault_table.print_table(terminalreporter)


def pytest_configure(config) -> None:
    module_cpu.register(config)
    hang_watch.register(config)
    job_cgroups.isolate()


def pytest_unconfigure(config) -> None:
    job_cgroups.remove_own()
    hang_watch.arm_exit_watch(config)


def pytest_collection_modifyitems(config, items) -> None:
    """The slowest modules first (tests/module_seconds.py), so pytest-xdist does not start them last; run with
    --no-loadscope-reorder, or xdist reorders modules by their number of tests."""
    seconds = module_seconds.load()
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0], 0.0))
