"""The usage report against a known set of jobs, computed by hand.

Period: October 2026 (UTC). GPU-hours allocated are clipped to the period; used = allocated x mean utilization.
  J1 vision/mia   2 GPUs  Oct 10 10:00-14:00        8 GPU-h   util 50 %  -> used 4.0, idle 4.0
  J2 vision/milo  1 GPU   Sep 30 22:00-Oct 1 02:00  2 GPU-h (clipped from 4)  util 25 % -> used 0.5, idle 1.5
  J3 vision/mia   4 GPUs  Oct 31 23:00-Nov 1 01:00  4 GPU-h (clipped from 8)  no stats  -> unknown 4
  J4 nlp/olga     1 GPU   Oct 5 00:00-06:00         6 GPU-h   util 100 % -> used 6.0, idle 0
  J5 vision/mia   1 GPU   Nov 5 (outside)           0
  J6 vision/milo  1 GPU   Oct 20 00-01 and 02-03    2 GPU-h   util 80 %  -> used 1.6, idle 0.4
vision: allocated 16, used 6.1, idle 5.9, unknown 4 | nlp: 6, 6, 0, 0 | all: 22, 12.1, 5.9, 4
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest

from apps.dashboard import reports
from apps.jobs.models import Job
from apps.telemetry.models import JobGpuStats
from tests.dashboard.conftest import hold, make_job

START = datetime(2026, 10, 1, tzinfo=UTC)
END = datetime(2026, 11, 1, tzinfo=UTC)
QUERY = "start=2026-10-01&end=2026-10-31"


def at(month, day, hour=0):
    return datetime(2026, month, day, hour, tzinfo=UTC)


def stats(job, mean, samples=4):
    JobGpuStats.objects.create(job=job, samples=samples, utilization_sum=mean * samples, utilization_max=mean)


@pytest.fixture
def jobs(world):
    g = world.gpus
    j1 = make_job(world.vision, world.member, state=Job.State.SUCCEEDED, gpus=2, name="j1")
    hold(j1, g[0:2], at(10, 10, 10), at(10, 10, 14))
    stats(j1, 50)
    j2 = make_job(world.vision, world.member2, state=Job.State.SUCCEEDED, name="j2")
    hold(j2, g[2:3], at(9, 30, 22), at(10, 1, 2))
    stats(j2, 25)
    j3 = make_job(world.vision, world.member, state=Job.State.SUCCEEDED, gpus=4, name="j3")
    hold(j3, g[3:7], at(10, 31, 23), at(11, 1, 1))
    j4 = make_job(world.nlp, world.other, state=Job.State.SUCCEEDED, name="j4")
    hold(j4, g[8:9], at(10, 5, 0), at(10, 5, 6))
    stats(j4, 100)
    j5 = make_job(world.vision, world.member, state=Job.State.SUCCEEDED, name="j5")
    hold(j5, g[9:10], at(11, 5, 0), at(11, 5, 6))
    stats(j5, 10)
    j6 = make_job(world.vision, world.member2, state=Job.State.SUCCEEDED, name="j6")
    hold(j6, g[10:11], at(10, 20, 0), at(10, 20, 1))
    from apps.jobs.models import UsageSegment

    UsageSegment.objects.create(job=j6, team=j6.team, user=j6.user, gpus=1, started_at=at(10, 20, 2),
                                ended_at=at(10, 20, 3))
    stats(j6, 80)
    return {"j1": j1, "j2": j2, "j3": j3, "j4": j4, "j5": j5, "j6": j6}


def rows(report_rows, key):
    return {key(r): (round(r.allocated, 6), round(r.used, 6), round(r.idle, 6), round(r.unknown, 6))
            for r in report_rows}


def test_report_numbers_by_hand(world, jobs):
    report = reports.usage_report([world.vision, world.nlp], START, END, costs={"H200": 4.5})
    assert rows(report.teams, lambda r: r.team) == {"nlp": (6, 6, 0, 0), "vision": (16, 6.1, 5.9, 4)}
    assert rows(report.users, lambda r: (r.team, r.user)) == {
        ("nlp", "olga"): (6, 6, 0, 0), ("vision", "mia"): (12, 4, 4, 4), ("vision", "milo"): (4, 2.1, 1.9, 0)}
    assert (round(report.total.allocated, 6), round(report.total.used, 6), round(report.total.idle, 6)) == (
        22, 12.1, 5.9)
    assert [r.job_name for r in report.top_waste()] == ["j1", "j2", "j6"]
    assert [r.job_name for r in report.unknown_jobs] == ["j3"]
    assert round(report.total.cost, 6) == 99.0
    assert round(report.teams[1].cost, 6) == 72.0
    assert jobs["j5"].pk not in {r.job_id for r in report.jobs}


def test_open_segments_end_now_and_costs_parse():
    assert reports.parse_costs("H200=4.5, A100=2.1,bad,=3,X=y") == {"H200": 4.5, "A100": 2.1}
    assert reports.parse_costs("") == {}


def test_open_segment_is_clipped_at_now(world):
    job = make_job(world.vision, world.member, state=Job.State.RUNNING)
    hold(job, world.gpus[:2], at(10, 1, 0))
    report = reports.usage_report([world.vision], START, END, costs={}, now=at(10, 1, 3))
    assert round(report.total.allocated, 6) == 6 and round(report.total.unknown, 6) == 6


def test_report_page_for_admin_and_manager(world, web, jobs, settings):
    settings.CONSOLE_GPU_HOUR_COST = "H200=4.5"
    admin = web(world.admin).get(f"/reports/usage/?{QUERY}")
    assert admin.status_code == 200
    assert [r.team for r in admin.context["report"].teams] == ["nlp", "vision"]
    html = admin.content.decode()
    assert "22.00" in html and "12.10" in html and "5.90" in html and "99.00" in html
    manager = web(world.manager).get(f"/reports/usage/?{QUERY}")
    assert [r.team for r in manager.context["report"].teams] == ["vision"]
    assert "olga" not in manager.content.decode()


@pytest.mark.parametrize("persona", ["member", "viewer", "other", "noteam"])
def test_report_is_404_for_non_managers(world, web, jobs, persona):
    assert web(world.persona(persona)).get(f"/reports/usage/?{QUERY}").status_code == 404
    assert web(world.persona(persona)).get(f"/reports/usage/?{QUERY}&format=csv").status_code == 404


def test_csv_export(world, web, jobs):
    response = web(world.manager).get(f"/reports/usage/?{QUERY}&format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    lines = list(csv.DictReader(io.StringIO(response.content.decode())))
    team = next(r for r in lines if r["section"] == "team")
    assert (team["team"], team["allocated_gpu_hours"], team["used_gpu_hours"], team["idle_gpu_hours"],
            team["unknown_gpu_hours"]) == ("vision", "16.0000", "6.1000", "5.9000", "4.0000")
    assert {r["user"] for r in lines if r["section"] == "user"} == {"mia", "milo"}
    assert sum(1 for r in lines if r["section"] == "job") == 4


def test_bad_period_shows_an_error_and_falls_back(world, web):
    response = web(world.admin).get("/reports/usage/?start=2026-10-10&end=2026-10-01")
    assert response.status_code == 200 and "The end is before the start." in response.content.decode()
    response = web(world.admin).get("/reports/usage/?start=yesterday")
    assert response.status_code == 200 and "Enter a valid date." in response.content.decode()
