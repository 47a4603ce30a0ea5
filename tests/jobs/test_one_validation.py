"""The API and the page reach the same checks through job_submit: the same bad workload gets the same answer."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from apps.jobs.workload_shape import MAX_ARG_LENGTH, MAX_ARGS
from tests.conftest import train_spec
from tests.dashboard.test_jobs import form_data

TOO_MANY = ["python3"] + ["x"] * MAX_ARGS
TOO_LONG = ["python3", "x" * (MAX_ARG_LENGTH + 1)]


@pytest.mark.parametrize("argv, fragment", [
    (TOO_MANY, f"At most {MAX_ARGS} arguments."),
    (TOO_LONG, f"at most {MAX_ARG_LENGTH} characters"),
])
def test_api_and_page_refuse_the_same_command_with_the_same_message(world, client_for, argv, fragment):
    from django.test import Client

    api = client_for(world.member).post("/api/v1/jobs/", train_spec(workload={"command": argv}), format="json")
    assert api.status_code == 400 and fragment in str(api.json()["workload"]["command"]), api.content

    page = Client()
    page.force_login(world.member)
    response = page.post("/jobs/new/", form_data(workload_mode="command", command="\n".join(argv), params=""))
    assert response.status_code == 400
    assert any(fragment in message for message in response.context["form"].errors["command"])
    assert not Job.objects.exists()


def test_a_user_cannot_submit_a_replica_workload(world, client_for):
    serve = {"serve": {"workload": "mlp-digits", "checkpoint": "x", "max_batch": 1, "max_wait_ms": 1}}
    response = client_for(world.member).post("/api/v1/jobs/", train_spec(kind="inference", preset="infer-fp32",
                                                                          workload=serve), format="json")
    assert response.status_code == 400 and "workload" in response.json(), response.content
    assert not Job.objects.exists()
