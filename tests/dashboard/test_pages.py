"""Every page answers for every persona the way its role allows; anonymous users go to the login page."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cluster.models import GPU, Host
from apps.jobs.models import Job
from apps.telemetry.models import GpuSampleBucket
from tests.dashboard.conftest import hold, make_job

PAGES = ["/", "/jobs/", "/jobs/new/", "/teams/", "/teams/vision/", "/reports/usage/", "/alerts/", "/accounts/tokens/",
         "/accounts/password_change/"]


@pytest.mark.parametrize("url", PAGES)
def test_anonymous_is_sent_to_login(world, web, url):
    response = web(None).get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(
    ("persona", "expected"),
    [
        ("admin", {"/jobs/new/": 200, "/teams/vision/": 200, "/reports/usage/": 200}),
        ("manager", {"/jobs/new/": 200, "/teams/vision/": 200, "/reports/usage/": 200}),
        ("member", {"/jobs/new/": 200, "/teams/vision/": 200, "/reports/usage/": 404}),
        ("viewer", {"/jobs/new/": 403, "/teams/vision/": 200, "/reports/usage/": 404}),
        ("other", {"/jobs/new/": 200, "/teams/vision/": 404, "/reports/usage/": 404}),
        ("noteam", {"/jobs/new/": 403, "/teams/vision/": 404, "/reports/usage/": 404}),
    ],
)
def test_pages_per_persona(world, web, persona, expected):
    client = web(world.persona(persona))
    for url in PAGES:
        response = client.get(url)
        assert response.status_code == expected.get(url, 200), (persona, url)


def test_navigation_links_and_landmarks(world, web):
    html = web(world.member).get("/").content.decode()
    for href in ['href="/jobs/"', 'href="/teams/"', 'href="/reports/usage/"', 'href="/alerts/"',
                 'href="/accounts/tokens/"', 'href="/accounts/password_change/"']:
        assert href in html
    assert 'aria-current="page"' in html and 'id="main"' in html and "Skip to content" in html


def test_overview_shows_hosts_gpus_jobs_and_totals(world, web):
    gpu = world.gpus[0]
    gpu.health = GPU.Health.HOT
    gpu.save()
    job = make_job(world.vision, world.member, state=Job.State.RUNNING, name="mine")
    hold(job, [world.gpus[1]], timezone.now() - timedelta(minutes=5))
    foreign = make_job(world.nlp, world.other, state=Job.State.RUNNING, name="theirs")
    hold(foreign, [world.gpus[2]], timezone.now() - timedelta(minutes=5))
    make_job(world.nlp, world.other, name="waiting")
    GpuSampleBucket.objects.create(gpu=world.gpus[1], resolution_s=10, bucket_start=timezone.now(), job=job,
                                   samples=10, available_samples=10, utilization_avg=87.0, memory_used_max_mb=1000,
                                   memory_total_mb=143771, temperature_max=61.0, power_avg_w=350.0)
    response = web(world.member).get("/")
    html = response.content.decode()
    overview = response.context["overview"]
    assert (overview.busy, overview.idle, overview.down) == (2, 14, 0)
    assert overview.queue == {}  # only nlp has a queued job: hidden from vision, as on the live stream
    assert "node-a" in html and "simulated" in html and "hot" in html
    assert f'href="/jobs/{job.pk}/"' in html  # own team's job is a link
    assert f'href="/jobs/{foreign.pk}/"' not in html  # another team's job is not
    assert "87 %" in html and "1.0/140.4 GiB" in html and "61 °C" in html and "350 W" in html
    assert "no data" in html  # GPUs without samples say so, never 0 %
    assert "GPU-history" not in html and 'id="gpu-history"' in html


def test_overview_for_a_user_without_team_shows_nothing(world, web):
    html = web(world.noteam).get("/").content.decode()
    assert "node-a" not in html and "not a member of any team" in html


def test_overview_with_512_gpus_is_fast_and_queries_do_not_grow(world, web, django_assert_max_num_queries):
    hosts = [Host.objects.create(name=f"big-{i:02d}", state=Host.State.UP, simulated=True) for i in range(62)]
    GPU.objects.bulk_create([
        GPU(host=host, index=i, uuid=f"GPU-{host.name}-{i}", gpu_type="H200", memory_mb=143771)
        for host in hosts for i in range(8)
    ])
    now = timezone.now()
    gpus = list(GPU.objects.all())
    assert len(gpus) == 512
    GpuSampleBucket.objects.bulk_create([
        GpuSampleBucket(gpu=gpu, resolution_s=10, bucket_start=now - timedelta(seconds=10 * k), samples=10,
                        available_samples=10, utilization_avg=50.0, memory_used_max_mb=10, memory_total_mb=143771,
                        temperature_max=50.0, power_avg_w=100.0)
        for gpu in gpus for k in range(6)
    ])
    for n in range(32):
        job = make_job(world.vision, world.member, state=Job.State.RUNNING, gpus=8)
        hold(job, gpus[n * 8:(n + 1) * 8], now - timedelta(minutes=5))
    client = web(world.member)
    client.get("/")  # warm caches (templates, content types)
    with django_assert_max_num_queries(20):
        response = client.get("/")
    elapsed = float("inf")
    for _ in range(3):  # best of three: the budget is the page's, not a busy test machine's
        started = time.perf_counter()
        client.get("/")
        elapsed = min(elapsed, time.perf_counter() - started)
    assert response.status_code == 200
    assert response.context["overview"].busy == 256
    print(f"overview with 512 GPUs: {elapsed * 1000:.0f} ms")
    assert elapsed < 1.0, f"overview took {elapsed:.2f} s"
