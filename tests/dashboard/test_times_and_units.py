"""One way to show times and one set of units on every page (issue 18): times through the `when` filter (24-hour,
with the zone, in a <time> element the pages' script rewrites in the browser's zone), memory in GiB."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from django.template import Context, Template
from django.utils import timezone

from apps.jobs.models import Job
from apps.telemetry.models import JobGpuStats
from tests.dashboard.conftest import hold, make_job

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
WHEN = re.compile(r'<time datetime="[^"]+" data-when="(seconds|minutes)">\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)? UTC</time>')


def render(text: str, **context) -> str:
    return Template("{% load console %}" + text).render(Context(context))


def test_the_when_filter_writes_the_zone_and_24_hour_time(settings):
    at = datetime(2026, 12, 3, 15, 4, 5, tzinfo=UTC)
    assert render("{{ t|when }}", t=at) == (
        '<time datetime="2026-12-03T15:04:05+00:00" data-when="seconds">2026-12-03 15:04:05 UTC</time>')
    assert render('{{ t|when:"minutes" }}', t=at).endswith(">2026-12-03 15:04 UTC</time>")
    assert render('{{ t|when|default:"never" }}', t=None) == "never"
    settings.TIME_ZONE = "Europe/Paris"
    with timezone.override("Europe/Paris"):
        assert ">2026-12-03 16:04:05 CET</time>" in render("{{ t|when }}", t=at)


def test_memory_is_shown_in_gib():
    assert render("{{ m|mb_gib }}", m=2048) == "2.0 GiB"
    assert render("{{ m|mb_gib }}", m=143771) == "140.4 GiB"
    assert render("{{ m|mb_gib }}", m=300) == "0.29 GiB"
    assert render("{{ m|mb_gib }}", m=None) == "—"


def test_no_page_formats_a_time_or_memory_its_own_way():
    """Every template shows times through `when` and no MB or MiB."""
    offenders = []
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        for pattern in (r'\|date:"[^"]*[HGhgi][^"]*"', r"\|time\b", r"naturaltime", r"\bMB\b", r"\bMiB\b"):
            offenders += [f"{path.name}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert offenders == []


def test_job_page_times_carry_their_zone_and_memory_is_gib(world, web):
    now = timezone.now()
    job = make_job(world.vision, world.member, state=Job.State.RUNNING, placed_at=now, started_at=now)
    hold(job, world.gpus[:1], now)
    JobGpuStats.objects.create(job=job, samples=4, utilization_sum=300.0, utilization_max=90.0, memory_max_mb=3072,
                               energy_j=7200.0)
    html = web(world.member).get(f"/jobs/{job.pk}/").content.decode()
    created = re.search(r"<dt>Created</dt><dd>(.*?)</dd>", html).group(1)
    started = re.search(r'<dd id="job-started">(.*?)</dd>', html).group(1)
    assert WHEN.fullmatch(created) and WHEN.fullmatch(started)
    assert '<dd id="job-finished">—</dd>' in html
    assert '<dd id="gpu-mem-max">3.0 GiB</dd>' in html
    events = re.findall(r'<ol[^>]*id="job-events"[^>]*>(.*?)</ol>', html, re.S)[0]
    assert WHEN.search(events)
