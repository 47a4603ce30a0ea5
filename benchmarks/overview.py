"""The cluster overview page (/) with 512 GPUs, its time beside its target (1.0 s).

    .venv/bin/python benchmarks/overview.py [--repeat 5] [--database postgres://...]

Builds, in a fresh SQLite database (or the empty PostgreSQL database --database names), the test suite's world
(tests/dashboard: two teams, 16 GPUs) grown to 512 GPUs: 62 more hosts of 8 H200 GPUs, a minute of samples
each, a running job on every other host. Then times GET / for a team member through Django's test client (the
view, its queries and the template; no network), after one warm-up request, and prints the best and the median
of --repeat beside the target, with the page's query count (tests/dashboard/test_pages.py checks that it does
not grow with the number of GPUs). Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_S = 1.0


def build_world() -> SimpleNamespace:
    from apps.accounts.models import Role
    from tests.dashboard.conftest import add_busy_hosts
    from tests.factories import HostFactory, MembershipFactory, TeamFactory, UserFactory, add_gpus

    vision = TeamFactory(slug="vision", quota__max_gpus=8)
    TeamFactory(slug="nlp", quota__max_gpus=8)
    member = UserFactory(username="mia")
    MembershipFactory(team=vision, user=member, role=Role.MEMBER)
    add_gpus(HostFactory(name="node-a"), 8)
    add_gpus(HostFactory(name="node-b"), 8)
    world = SimpleNamespace(vision=vision, member=member)
    add_busy_hosts(world, 0, 62)
    return world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database", help="an empty database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-overview-")
    os.environ["DATABASE_URL"] = args.database or f"sqlite:///{folder}/db.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings_test")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from apps.cluster.models import GPU

    setup_test_environment()  # the test client's host name, templates' context on the response
    call_command("migrate", "--noinput", verbosity=0)
    world = build_world()
    client = Client()
    client.force_login(world.member)
    assert client.get("/").status_code == 200  # warm-up: templates, content types, caches
    queries: list[str] = []

    def count(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):  # (the connection a request opens wraps its queries too)
        response = client.get("/")
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        client.get("/")
        times.append(time.perf_counter() - started)
    overview = response.context["overview"]
    print(f"overview (/) for a team member: {GPU.objects.count()} GPUs, {overview.busy} busy, "
          f"{connection.vendor}, {args.repeat} requests")
    print(f"{'':<22}{'measured':>10}{'target':>10}")
    print(f"{'best (ms)':<22}{min(times) * 1000:>10.0f}{'< ' + format(TARGET_S * 1000, '.0f'):>10}")
    print(f"{'median (ms)':<22}{statistics.median(times) * 1000:>10.0f}{'':>10}")
    print(f"{'queries':<22}{len(queries):>10}{'<= 20':>10}")
    verdict = "meets" if min(times) < TARGET_S else "MISSES"
    print(f"{verdict} the target on this machine (best of {args.repeat})")


if __name__ == "__main__":
    main()
