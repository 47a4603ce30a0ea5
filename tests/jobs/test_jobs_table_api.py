"""GET /api/v1/jobs/ with the jobs table's search and sorting (the page's parameters), and
POST /api/v1/jobs/cancel/: several jobs at once, one result per id, for every persona."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import Job
from tests.dashboard.conftest import make_job


@pytest.fixture
def jobs(world):
    now = timezone.now()
    return {
        "alpha": make_job(world.vision, world.member, name="alpha", priority="high", gpus=4, state=Job.State.RUNNING,
                          started_at=now - timedelta(minutes=30)),
        "bravo": make_job(world.vision, world.member2, name="Bravo", priority="low", gpus=1),
        "charlie": make_job(world.vision, world.member, name="charlie-resnet", priority="normal", gpus=2,
                            state=Job.State.SUCCEEDED, started_at=now - timedelta(hours=3),
                            finished_at=now - timedelta(hours=1)),
        "secret": make_job(world.nlp, world.other, name="secret-resnet"),
    }


def listed(client, **params) -> list[str]:
    response = client.get("/api/v1/jobs/", params)
    assert response.status_code == 200, response.json()
    return [job["name"] for job in response.json()["results"]]


def test_list_sorts_and_searches_like_the_page(world, jobs, client_for):
    client = client_for(world.manager)
    assert listed(client) == ["charlie-resnet", "Bravo", "alpha"]  # newest first, as before
    assert listed(client, ordering="name") == ["alpha", "Bravo", "charlie-resnet"]
    assert listed(client, ordering="-priority") == ["alpha", "charlie-resnet", "Bravo"]
    assert listed(client, ordering="-gpus") == ["alpha", "charlie-resnet", "Bravo"]
    assert listed(client, ordering="-duration") == ["charlie-resnet", "alpha", "Bravo"]
    assert listed(client, ordering="state") == ["alpha", "Bravo", "charlie-resnet"]
    assert listed(client, name="ResNet") == ["charlie-resnet"]  # never nlp's
    assert listed(client, state=["queued", "running"], ordering="submitted") == ["alpha", "Bravo"]
    assert listed(client_for(world.member), mine="true", ordering="name") == ["alpha", "charlie-resnet"]
    assert listed(client_for(world.member), mine="false", ordering="name") == ["alpha", "Bravo", "charlie-resnet"]
    assert listed(client_for(world.admin), name="resnet", ordering="-name") == ["secret-resnet", "charlie-resnet"]
    assert listed(client, team="vision", user="milo", kind="train") == ["Bravo"]  # the existing filters still work


@pytest.mark.parametrize(("params", "field"), [({"ordering": "-cost"}, "ordering"), ({"state": "sleeping"}, "state"),
                                              ({"name": "x" * 201}, "name")])
def test_bad_list_parameters_are_400_naming_them(world, jobs, client_for, params, field):
    response = client_for(world.manager).get("/api/v1/jobs/", params)
    assert response.status_code == 400
    assert field in response.json()


def cancel(client, ids, **extra):
    return client.post("/api/v1/jobs/cancel/", {"ids": ids, **extra}, format="json")


def test_bulk_cancel_reports_each_id(world, jobs, client_for):
    ids = [jobs["alpha"].pk, jobs["bravo"].pk, jobs["charlie"].pk, jobs["secret"].pk, 999999, jobs["alpha"].pk]
    response = cancel(client_for(world.member), ids, reason="cleanup")
    assert response.status_code == 200
    body = response.json()
    assert (body["cancelled"], body["refused"]) == (1, 4)
    results = {r["id"]: r for r in body["results"]}
    assert [r["id"] for r in body["results"]] == ids[:-1]  # in order, each once
    assert results[jobs["alpha"].pk] == {"id": jobs["alpha"].pk, "cancelled": True, "status": 200,
                                         "detail": "cancelled", "state": "cancelled"}
    assert results[jobs["bravo"].pk]["status"] == 403 and results[jobs["bravo"].pk]["state"] == "queued"
    assert results[jobs["charlie"].pk]["status"] == 409 and "already succeeded" in results[jobs["charlie"].pk]["detail"]
    for hidden in (jobs["secret"].pk, 999999):  # another team's job answers as one that does not exist
        assert results[hidden] == {"id": hidden, "cancelled": False, "status": 404, "detail": "No such job.",
                                   "state": None}
    assert Job.objects.get(pk=jobs["alpha"].pk).events.last().reason == "cancelled by mia: cleanup"
    assert Job.objects.get(pk=jobs["bravo"].pk).state == Job.State.QUEUED


@pytest.mark.parametrize(("persona", "cancelled"), [
    ("admin", {"alpha", "Bravo", "secret-resnet"}), ("manager", {"alpha", "Bravo"}), ("member", {"alpha"}),
    ("viewer", set()), ("other", {"secret-resnet"}), ("noteam", set())])
def test_bulk_cancel_for_each_persona(world, jobs, client_for, persona, cancelled):
    response = cancel(client_for(world.persona(persona)), [job.pk for job in jobs.values()])
    assert response.status_code == 200
    assert {r["id"] for r in response.json()["results"] if r["cancelled"]} == {
        job.pk for job in jobs.values() if job.name in cancelled}
    assert set(Job.objects.filter(state=Job.State.CANCELLED).values_list("name", flat=True)) == cancelled


def test_bulk_cancel_needs_a_login(db, client_for):
    assert cancel(client_for(None), [1]).status_code == 401


@pytest.mark.parametrize(("body", "field"), [
    ({}, "ids"), ({"ids": []}, "ids"), ({"ids": "1,2"}, "ids"), ({"ids": [0]}, "ids"), ({"ids": ["x"]}, "ids"), ({"ids": [2**63]}, "ids"),
    ({"ids": list(range(1, 502))}, "ids"), ({"ids": [1], "reason": "x" * 301}, "reason"),
    ({"ids": [1], "force": True}, "force"),
])
def test_bulk_cancel_bad_input_is_400_naming_the_field(world, jobs, client_for, body, field):
    response = client_for(world.manager).post("/api/v1/jobs/cancel/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not Job.objects.filter(state=Job.State.CANCELLED).exists()
