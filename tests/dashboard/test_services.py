"""Inference service pages: the list with its create form, the service page, scale and delete, for every role."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from apps.jobs.models import Job
from apps.serving import services
from apps.serving.models import InferenceService, ServiceEvent
from tests.dashboard.conftest import make_job


def create_data(**overrides):
    data = {"team": "vision", "name": "digits", "workload": "mlp-digits", "checkpoint": "", "preset": "infer-int8",
            "gpus_per_replica": "1", "min_replicas": "1", "max_replicas": "2", "target_p95_ms": "50",
            "target_rps_per_replica": "", "batching": "on", "max_batch": "32", "max_wait_ms": "5"}
    data.update(overrides)
    return data


def make_service(world, team=None, name="digits", **fields):
    team = team or world.vision
    owner = world.member if team == world.vision else world.other
    spec = services.ServiceSpec(team=team, name=name, workload="mlp-digits", max_replicas=2, **fields)
    return services.service_create(user=owner, spec=spec)


def test_member_creates_a_service_through_the_form(world, web):
    trained = make_job(world.vision, world.member, state=Job.State.SUCCEEDED)
    response = web(world.member).post("/services/", create_data(checkpoint=f"{trained.pk}/outputs/model.pt"))
    service = InferenceService.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/services/{service.pk}/"
    assert (service.team, service.owner, service.preset, service.checkpoint) == (
        world.vision, world.member, "infer-int8", f"{trained.pk}/outputs/model.pt")
    assert (service.min_replicas, service.max_replicas, service.target_p95_ms, service.target_rps_per_replica) == (
        1, 2, 50.0, None)
    assert service.batching and service.max_batch == 32
    replica = service.replicas.get()
    assert replica.job.kind == Job.Kind.INFERENCE and replica.job.user == world.member
    assert ServiceEvent.objects.filter(service=service, kind="created").exists()


def test_unchecked_batching_turns_it_off(world, web):
    data = create_data()
    data.pop("batching")
    assert web(world.member).post("/services/", data).status_code == 302
    assert InferenceService.objects.get().batching is False


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"name": ""}, "name", "required"),
        ({"name": "Not A Slug!"}, "name", "valid"),
        ({"workload": "nope"}, "workload", "valid choice"),
        ({"preset": "amp-bf16"}, "preset", "valid choice"),  # a training preset
        ({"team": "nlp"}, "team", "valid choice"),  # not the member's team
        ({"min_replicas": "3", "max_replicas": "2"}, "min_replicas", "may not exceed"),
        ({"gpus_per_replica": "0"}, "gpus_per_replica", "greater than or equal to 1"),
        ({"target_p95_ms": "fast"}, "target_p95_ms", "number"),
        ({"checkpoint": "999/outputs/model.pt"}, "checkpoint", "same team"),  # JobSpecError from the service
    ],
)
def test_bad_input_shows_field_errors_and_creates_nothing(world, web, overrides, field, fragment):
    response = web(world.member).post("/services/", create_data(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors and any(fragment in e for e in errors[field]), errors
    assert f'id="id_{field}_error"' in response.content.decode()
    assert not InferenceService.objects.exists() and not Job.objects.exists()


def test_another_teams_checkpoint_is_refused_by_the_service(world, web):
    foreign = make_job(world.nlp, world.other, state=Job.State.SUCCEEDED)
    response = web(world.member).post("/services/", create_data(checkpoint=f"{foreign.pk}/outputs/model.pt"))
    assert response.status_code == 400 and "same team" in str(response.context["form"].errors["checkpoint"])
    assert not InferenceService.objects.exists()


def test_duplicate_name_is_a_field_error(world, web):
    make_service(world)
    response = web(world.member).post("/services/", create_data())
    assert response.status_code == 400 and "already has a service" in str(response.context["form"].errors["name"])
    assert InferenceService.objects.count() == 1


def test_permission_error_from_the_service_is_a_form_error(world, web, monkeypatch):
    from apps.jobs.errors import JobPermissionError

    def refuse(**kwargs):
        raise JobPermissionError("Only members of team vision may create its services.")

    monkeypatch.setattr(services, "service_create", refuse)
    response = web(world.member).post("/services/", create_data())
    assert response.status_code == 400
    assert "Only members of team vision" in response.context["form"].non_field_errors()[0]
    assert 'role="alert"' in response.content.decode()


def test_viewer_sees_services_but_no_form_and_cannot_create(world, web):
    service = make_service(world)
    client = web(world.viewer)
    page = client.get("/services/")
    assert page.status_code == 200 and page.context["form"] is None
    html = page.content.decode()
    assert f'href="/services/{service.pk}/"' in html and 'id="service-form"' not in html
    assert client.post("/services/", create_data(name="sneaky")).status_code == 403
    assert InferenceService.objects.count() == 1


def test_list_shows_own_teams_only_and_admins_everything(world, web):
    mine = make_service(world)
    theirs = make_service(world, team=world.nlp, name="translate")
    cache.set(services.stats_key(mine.pk), {"replicas": 1, "ready": 1, "rps": 12.5, "p50_ms": 3.0, "p95_ms": 7.2,
                                            "p99_ms": 9.0, "queue_depth": 0, "error_rate": 0.02, "requests": 50})
    html = web(world.member).get("/services/").content.decode()
    assert "digits" in html and "translate" not in html
    row = html[html.index(f'data-service="{mine.pk}"'):]
    row = row[:row.index("</tr>")]
    assert "1 / 1" in row and "7.2 ms" in row and "12.5" in row and "2 %" in row
    admin_html = web(world.admin).get("/services/").content.decode()
    assert f'href="/services/{mine.pk}/"' in admin_html and f'href="/services/{theirs.pk}/"' in admin_html
    assert 'id="service-form"' in admin_html
    assert web(world.noteam).get("/services/").context["rows"] == []
    assert web(None).get("/services/").status_code == 302


def test_navigation_links_to_services(world, web):
    html = web(world.member).get("/services/").content.decode()
    assert '<a href="/services/" aria-current="page">Services</a>' in html


def test_service_page_shows_endpoint_replicas_events_and_controls(world, web):
    service = make_service(world)
    replica = service.replicas.get()
    cache.set(services.replicas_key(service.pk), [{"job": replica.job_id, "url": "http://127.0.0.1:1"}])
    page = web(world.member).get(f"/services/{service.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "POST /serve/vision/digits/predict" in html
    assert "curl -X POST http://testserver/serve/vision/digits/predict" in html and "$CONSOLE_TOKEN" in html
    assert f'href="/jobs/{replica.job_id}/"' in html and ">ready<" in html
    assert "created by mia" in html and "replica_started" in html
    assert 'id="scale-form"' in html and 'id="delete-form"' in html and "data-confirm" in html
    assert 'id="chart-latency"' in html and f'"service": {service.pk}' in html


def test_viewer_sees_the_service_page_without_controls(world, web):
    service = make_service(world)
    html = web(world.viewer).get(f"/services/{service.pk}/").content.decode()
    assert "POST /serve/vision/digits/predict" in html
    assert 'id="scale-form"' not in html and 'id="delete-form"' not in html
    client = web(world.viewer)
    assert client.post(f"/services/{service.pk}/scale/", {"min_replicas": "0", "max_replicas": "1"}).status_code == 403
    assert client.post(f"/services/{service.pk}/delete/").status_code == 403
    service.refresh_from_db()
    assert service.state == InferenceService.State.ACTIVE and service.max_replicas == 2


@pytest.mark.parametrize("persona", ["other", "noteam"])
def test_other_teams_get_404_on_the_service_and_its_actions(world, web, persona):
    service = make_service(world)
    client = web(world.persona(persona))
    assert client.get(f"/services/{service.pk}/").status_code == 404
    assert client.post(f"/services/{service.pk}/scale/", {"min_replicas": "0", "max_replicas": "1"}).status_code == 404
    assert client.post(f"/services/{service.pk}/delete/").status_code == 404
    service.refresh_from_db()
    assert service.state == InferenceService.State.ACTIVE


def test_anonymous_is_sent_to_login(world, web):
    service = make_service(world)
    response = web(None).get(f"/services/{service.pk}/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("persona", ["member", "manager", "admin"])
def test_members_scale_a_service(world, web, persona):
    service = make_service(world)
    response = web(world.persona(persona)).post(f"/services/{service.pk}/scale/", {
        "min_replicas": "2", "max_replicas": "4", "target_p95_ms": "", "target_rps_per_replica": "30"})
    assert response.status_code == 302 and response["Location"] == f"/services/{service.pk}/"
    service.refresh_from_db()
    assert (service.min_replicas, service.max_replicas, service.desired_replicas) == (2, 4, 2)
    assert service.target_p95_ms is None and service.target_rps_per_replica == 30
    assert service.events.filter(kind="scale", reason__contains="1 → 2").exists()


@pytest.mark.parametrize(
    ("data", "field"),
    [({"min_replicas": "3", "max_replicas": "2"}, "min_replicas"),
     ({"min_replicas": "1", "max_replicas": "0"}, "max_replicas"),
     ({"min_replicas": "1", "max_replicas": "2", "target_p95_ms": "-5"}, "target_p95_ms"),
     ({"min_replicas": "", "max_replicas": "2"}, "min_replicas")],
)
def test_bad_scaling_is_refused_with_field_errors(world, web, data, field):
    service = make_service(world)
    response = web(world.member).post(f"/services/{service.pk}/scale/", data)
    assert response.status_code == 400 and field in response.context["scale_form"].errors
    service.refresh_from_db()
    assert (service.min_replicas, service.max_replicas, service.target_p95_ms) == (1, 2, None)


def test_scale_shows_the_services_own_errors(world, web, monkeypatch):
    from apps.jobs.errors import JobSpecError

    def refuse(**kwargs):
        raise JobSpecError({"min_replicas": ["min_replicas may not exceed max_replicas."]})

    service = make_service(world)
    monkeypatch.setattr(services, "service_scale", refuse)
    response = web(world.member).post(f"/services/{service.pk}/scale/", {"min_replicas": "1", "max_replicas": "2"})
    assert response.status_code == 400
    assert "may not exceed" in str(response.context["scale_form"].errors["min_replicas"])


def test_member_deletes_a_service_and_its_replicas_stop(world, web):
    service = make_service(world)
    job = service.replicas.get().job
    response = web(world.member2).post(f"/services/{service.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == "/services/"
    service.refresh_from_db()
    assert service.state == InferenceService.State.DELETED
    assert service.replicas.get().retired
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert web(world.member).get(f"/services/{service.pk}/").status_code == 404
    assert "digits" not in web(world.member).get("/services/").content.decode().split("<table")[1].split("</table>")[0]


def test_delete_needs_post_and_csrf(world):
    from django.test import Client

    service = make_service(world)
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.member)
    assert client.get(f"/services/{service.pk}/delete/").status_code == 405
    assert client.post(f"/services/{service.pk}/delete/").status_code == 403
    service.refresh_from_db()
    assert service.state == InferenceService.State.ACTIVE
