"""The jobs table (/jobs/): sorting, search, filters, its rows' placement, duration, live utilization, progress and
ETA, the rows fragment its script polls; bulk cancel with its confirm step (/jobs/cancel/); the queue
(/jobs/pending/). Each for the personas of `world`: admin, manager, member, viewer, other team, no team."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.core.cache import cache
from django.utils import timezone

from apps.jobs.models import Job
from apps.telemetry.services import frame_key
from tests.dashboard.conftest import hold, make_job


def names(response) -> list[str]:
    return [row.job.name for row in response.context["rows"]]


@pytest.fixture
def mixed(world):
    """Vision jobs that differ in every sorted column, and one nlp job."""
    now = timezone.now()
    jobs = {
        "alpha": make_job(world.vision, world.member, name="alpha", priority="high", gpus=4, state=Job.State.RUNNING,
                          started_at=now - timedelta(minutes=30)),
        "Bravo": make_job(world.vision, world.member2, name="Bravo", priority="low", gpus=1, state=Job.State.QUEUED),
        "charlie": make_job(world.vision, world.member, name="charlie", priority="normal", gpus=2,
                            state=Job.State.SUCCEEDED, started_at=now - timedelta(hours=3),
                            finished_at=now - timedelta(hours=1), kind="inference"),
        "delta": make_job(world.vision, world.member2, name="delta-resnet", priority="urgent", gpus=8,
                          state=Job.State.FAILED, started_at=now - timedelta(minutes=20),
                          finished_at=now - timedelta(minutes=15)),
        "secret": make_job(world.nlp, world.other, name="secret-resnet", gpus=1),
    }
    return jobs


@pytest.mark.parametrize(("ordering", "expected"), [
    ("", ["delta-resnet", "charlie", "Bravo", "alpha"]),  # newest first, as before
    ("submitted", ["alpha", "Bravo", "charlie", "delta-resnet"]),
    ("name", ["alpha", "Bravo", "charlie", "delta-resnet"]),  # any case
    ("-name", ["delta-resnet", "charlie", "Bravo", "alpha"]),
    ("state", ["alpha", "Bravo", "charlie", "delta-resnet"]),  # running, queued, succeeded, failed
    ("-priority", ["delta-resnet", "alpha", "charlie", "Bravo"]),  # urgent, high, normal, low
    ("priority", ["Bravo", "charlie", "alpha", "delta-resnet"]),
    ("-gpus", ["delta-resnet", "alpha", "charlie", "Bravo"]),
    ("-duration", ["charlie", "alpha", "delta-resnet", "Bravo"]),  # 2 h, 30 min, 5 min, never started (last)
    ("duration", ["delta-resnet", "alpha", "charlie", "Bravo"]),
    ("nonsense", ["delta-resnet", "charlie", "Bravo", "alpha"]),  # not a choice: the default
])
def test_sorting(world, web, mixed, ordering, expected):
    response = web(world.manager).get("/jobs/", {"ordering": ordering} if ordering else {})
    assert response.status_code == 200
    assert names(response) == expected


def test_search_by_name_and_filters(world, web, mixed):
    client = web(world.manager)
    assert names(client.get("/jobs/", {"name": "RESNET"})) == ["delta-resnet"]  # not nlp's secret-resnet
    assert names(client.get("/jobs/", {"state": "running"})) == ["alpha"]
    assert names(client.get("/jobs/", {"kind": "inference"})) == ["charlie"]
    assert names(client.get("/jobs/", {"user": "milo", "ordering": "name"})) == ["Bravo", "delta-resnet"]
    assert names(web(world.member).get("/jobs/", {"mine": "on", "ordering": "name"})) == ["alpha", "charlie"]
    assert names(client.get("/jobs/", {"team": "nlp"})) == names(client.get("/jobs/"))  # not a choice: ignored
    admin = web(world.admin)
    assert names(admin.get("/jobs/", {"name": "resnet", "ordering": "name"})) == ["delta-resnet", "secret-resnet"]
    assert names(admin.get("/jobs/", {"team": "nlp"})) == ["secret-resnet"]


@pytest.mark.parametrize(("persona", "seen"), [
    ("admin", 5), ("manager", 4), ("member", 4), ("viewer", 4), ("other", 1), ("noteam", 0)])
def test_each_persona_sees_its_teams_jobs(world, web, mixed, persona, seen):
    response = web(world.persona(persona)).get("/jobs/")
    assert response.status_code == 200
    assert len(response.context["rows"]) == seen
    assert ("secret-resnet" in response.content.decode()) == (persona in ("admin", "other"))


def test_sort_links_keep_filters_and_say_the_current_order(world, web, mixed):
    html = web(world.manager).get("/jobs/", {"state": "queued", "ordering": "name"}).content.decode()
    assert 'aria-sort="ascending"><a href="?state=queued&amp;ordering=-name"' in html
    assert 'aria-sort="none"><a href="?state=queued&amp;ordering=-gpus"' in html


def test_rows_show_placement_duration_live_utilization_progress_and_eta(world, web):
    now = timezone.now()
    job = make_job(world.vision, world.member, name="train", gpus=2, state=Job.State.RUNNING,
                   started_at=now - timedelta(minutes=10), max_steps=1000, steps_done=250, steps_per_second=5.0)
    hold(job, [world.gpus[0], world.gpus[1]], now - timedelta(minutes=10))
    cache.set(frame_key("node-a"), {"host": "node-a", "ts": time.time(), "received": time.time(), "gpus": [
        {"uuid": "GPU-node-a-0", "index": 0, "utilization_pct": 80.0},
        {"uuid": "GPU-node-a-1", "index": 1, "utilization_pct": 60.0}]})
    ended = make_job(world.vision, world.member, name="ended", state=Job.State.SUCCEEDED, max_steps=100,
                     steps_done=100, started_at=now - timedelta(hours=2), finished_at=now - timedelta(minutes=30),
                     attempts=1)
    hold(ended, [world.gpus[9]], now - timedelta(hours=2), now - timedelta(minutes=30))
    ended.allocations.update(attempt=1)
    response = web(world.member).get("/jobs/", {"ordering": "name"})
    rows = {row.job.name: row for row in response.context["rows"]}
    running = rows["train"]
    assert running.placement == "node-a:0,1"
    assert running.gpu_uuids == ["GPU-node-a-0", "GPU-node-a-1"]
    assert running.utilization == 70.0
    assert 590 <= running.duration_s <= 700
    assert running.progress["percent"] == 25.0 and running.progress["eta_s"] == 150.0
    assert rows["ended"].placement == "node-b:1" and rows["ended"].duration_s == 90 * 60
    assert rows["ended"].utilization is None and rows["ended"].progress["eta_s"] is None
    html = response.content.decode()
    assert "70 %" in html and "about 2 min left" in html and "1.5 h" in html and "node-a:0,1" in html


def test_utilization_is_no_data_when_the_host_went_silent(world, web):
    now = timezone.now()
    job = make_job(world.vision, world.member, state=Job.State.RUNNING, started_at=now)
    hold(job, [world.gpus[0]], now)
    cache.set(frame_key("node-a"), {"host": "node-a", "ts": 0, "received": time.time() - 3600,
                                    "gpus": [{"uuid": "GPU-node-a-0", "index": 0, "utilization_pct": 99.0}]})
    response = web(world.member).get("/jobs/")
    assert response.context["rows"][0].utilization is None
    assert "no data" in response.content.decode()


def test_rows_fragment_for_the_script_and_its_etag(world, web, mixed):
    client = web(world.manager)
    response = client.get("/jobs/", {"state": "queued", "fragment": "rows"})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    data = response.json()
    assert "Bravo" in data["rows"] and "alpha" not in data["rows"] and data["summary"] == "1 job"
    again = client.get("/jobs/", {"state": "queued", "fragment": "rows"}, HTTP_IF_NONE_MATCH=response["ETag"])
    assert again.status_code == 304
    Job.objects.filter(name="Bravo").update(state=Job.State.CANCELLED)
    changed = client.get("/jobs/", {"state": "queued", "fragment": "rows"}, HTTP_IF_NONE_MATCH=response["ETag"])
    assert changed.status_code == 200 and "No jobs match." in changed.json()["rows"]


@pytest.mark.parametrize(("persona", "boxes"), [
    ("admin", {"alpha", "Bravo", "secret-resnet"}), ("manager", {"alpha", "Bravo"}), ("member", {"alpha"}),
    ("viewer", set()), ("other", {"secret-resnet"}), ("noteam", set())])
def test_checkboxes_only_for_jobs_the_user_may_cancel(world, web, mixed, persona, boxes):
    response = web(world.persona(persona)).get("/jobs/")
    assert {row.job.name for row in response.context["rows"] if row.may_cancel} == boxes  # never an ended one
    html = response.content.decode()
    assert html.count('name="ids"') == len(boxes)
    assert ('id="cancel-selected"' in html) == bool(boxes)


def post_cancel(client, ids, **extra):
    return client.post("/jobs/cancel/", {"ids": [str(i) for i in ids], "next": "/jobs/?state=queued", **extra})


def flash(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_bulk_cancel_asks_first_listing_the_jobs_then_cancels_only_those_allowed(world, web, mixed):
    client = web(world.member)  # mia: may cancel her own vision jobs only
    mine, others, ended, hidden = mixed["alpha"], mixed["Bravo"], mixed["charlie"], mixed["secret"]
    extra = make_job(world.vision, world.member, name="also-mine")
    ask = post_cancel(client, [mine.pk, others.pk, ended.pk, hidden.pk, extra.pk], reason="cleanup")
    assert ask.status_code == 200
    html = ask.content.decode()
    assert "Cancel 2 jobs?" in html and 'id="confirm-items"' in html
    assert f"{mine.pk} (alpha, vision, mia, running)" in html and f"{extra.pk} (also-mine" in html
    assert "You may not cancel this job." in html and "already succeeded" in html and "No such job." in html
    assert "secret-resnet" not in html  # another team's job is never named
    assert f'name="ids" value="{mine.pk},{extra.pk}"' in html and 'name="next" value="/jobs/?state=queued"' in html
    assert Job.objects.filter(state=Job.State.CANCELLED).count() == 0  # nothing happens before the yes

    done = client.post("/jobs/cancel/", {"ids": f"{mine.pk},{extra.pk}", "reason": "cleanup", "confirm": "yes",
                                         "next": "/jobs/?state=queued"})
    assert done.status_code == 302 and done["Location"] == "/jobs/?state=queued"
    assert flash(done) == [f"Cancelled 2 jobs: {mine.pk}, {extra.pk}."]
    assert set(Job.objects.filter(state=Job.State.CANCELLED).values_list("name", flat=True)) == {"alpha", "also-mine"}
    assert "cancelled by mia: cleanup" in mine.events.last().reason


def test_a_confirmed_post_still_refuses_each_job_the_user_may_not_cancel(world, web, mixed):
    """A forged confirmed post (ids of jobs the page never offered) cancels nothing it should not."""
    response = post_cancel(web(world.member), [mixed["Bravo"].pk, mixed["secret"].pk, mixed["alpha"].pk],
                           confirm="yes")
    assert response.status_code == 302
    assert flash(response) == [f"Cancelled 1 job: {mixed['alpha'].pk}.",
                               f"Not cancelled: {mixed['Bravo'].pk}: You may not cancel this job.; "
                               f"{mixed['secret'].pk}: No such job."]
    assert list(Job.objects.filter(state=Job.State.CANCELLED).values_list("name", flat=True)) == ["alpha"]


@pytest.mark.parametrize(("persona", "cancelled"), [
    ("admin", {"alpha", "Bravo", "secret-resnet"}), ("manager", {"alpha", "Bravo"}), ("member", {"alpha"}),
    ("viewer", set()), ("other", {"secret-resnet"}), ("noteam", set())])
def test_bulk_cancel_for_each_persona(world, web, mixed, persona, cancelled):
    ids = [job.pk for job in mixed.values()]
    response = post_cancel(web(world.persona(persona)), ids, confirm="yes")
    assert response.status_code == 302
    assert set(Job.objects.filter(state=Job.State.CANCELLED).values_list("name", flat=True)) == cancelled


@pytest.mark.parametrize("persona", ["viewer", "noteam"])
def test_nothing_to_cancel_goes_back_saying_why_without_a_confirm_step(world, web, mixed, persona):
    response = post_cancel(web(world.persona(persona)), [mixed["alpha"].pk])
    assert response.status_code == 302
    assert flash(response)[0].startswith("None of the selected jobs can be cancelled")


@pytest.mark.parametrize("ids", [[], ["x1"], ["0"]])
def test_bad_selection_is_refused_with_a_message(world, web, mixed, ids):
    response = web(world.manager).post("/jobs/cancel/", {"ids": ids, "confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == "/jobs/"
    assert flash(response) and not Job.objects.filter(state=Job.State.CANCELLED).exists()


def test_next_never_leaves_the_site(world, web, mixed):
    response = post_cancel(web(world.manager), [mixed["alpha"].pk], confirm="yes", next="https://evil.example/")
    assert response["Location"] == "/jobs/"


# --- the queue


@pytest.fixture
def queue(world):
    """Waiting jobs in the scheduler's order: positions 1-6, vision's at 2, 3 and 6, nlp's at 1, 4 and 5; one
    vision job not ranked yet; one running job (not waiting)."""
    soon = timezone.now() + timedelta(minutes=20)
    teams = {1: (world.nlp, world.other), 2: (world.vision, world.member), 3: (world.vision, world.member2),
             4: (world.nlp, world.other), 5: (world.nlp, world.other), 6: (world.vision, world.member)}
    jobs = {}
    for position in (6, 5, 4, 3, 2, 1):  # created out of order: the page sorts by position
        team, user = teams[position]
        jobs[position] = make_job(team, user, name=f"{team.slug}-{position}", queue_position=position,
                                  pending_reason=f"reason {position}", estimated_start=soon,
                                  estimate_confidence=0.75)
    jobs["new"] = make_job(world.vision, world.member, name="vision-new")
    make_job(world.vision, world.member, name="vision-running", state=Job.State.RUNNING)
    return jobs


def pending(response) -> list[tuple[str, int]]:
    return [(row.job.name, row.hidden_before) for row in response.context["rows"]]


@pytest.mark.parametrize("persona", ["manager", "member", "viewer"])
def test_queue_lists_visible_waiting_jobs_in_order_with_counts_of_hidden_ones_ahead(world, web, queue, persona):
    response = web(world.persona(persona)).get("/jobs/pending/")
    assert response.status_code == 200
    assert pending(response) == [("vision-2", 1), ("vision-3", 0), ("vision-6", 2), ("vision-new", 0)]
    assert response.context["hidden"] == 3 and response.context["total"] == 4
    html = response.content.decode()
    assert "… 1 waiting job of other teams (not shown)" in html and "… 2 waiting jobs of other teams" in html
    assert "nlp" not in html.replace("nlp-", "")  # never the other team's name
    assert "reason 2" in html and "confidence 0.75" in html and "not ranked yet" in html
    assert "reason 1" not in html


def test_queue_for_the_other_team_counts_only_what_is_ahead_of_its_jobs(world, web, queue):
    response = web(world.other).get("/jobs/pending/")
    assert pending(response) == [("nlp-1", 0), ("nlp-4", 2), ("nlp-5", 0)]  # vision's 6 and new: behind, unsaid


def test_queue_for_admins_is_everything_and_hides_nothing(world, web, queue):
    response = web(world.admin).get("/jobs/pending/")
    assert [name for name, _ in pending(response)] == [
        "nlp-1", "vision-2", "vision-3", "nlp-4", "nlp-5", "vision-6", "vision-new"]
    assert response.context["hidden"] == 0 and "other teams" not in response.content.decode()


def test_queue_for_a_user_without_a_team_says_so_and_counts_nothing(world, web, queue):
    response = web(world.noteam).get("/jobs/pending/")
    assert response.status_code == 200 and response.context["rows"] == [] and response.context["hidden"] == 0
    html = response.content.decode()
    assert 'id="no-team"' in html and "No waiting jobs you may see." in html and "other teams" not in html


def test_queue_fragment_and_nav_link(world, web, queue):
    client = web(world.member)
    data = client.get("/jobs/pending/", {"fragment": "rows"}).json()
    assert "vision-2" in data["rows"] and data["summary"].startswith("4 waiting jobs you may see; 3 of other teams")
    assert 'href="/jobs/pending/"' in client.get("/jobs/").content.decode()


def test_page_without_login_goes_to_the_login_page(db, web):
    for path in ("/jobs/", "/jobs/pending/"):
        assert web(None).get(path).status_code == 302
    assert web(None).post("/jobs/cancel/", {"ids": "1"}).status_code == 302
