"""Job arrays (Slurm's --array): one submission queues `array_size` tasks, alike but for their index, each a job
of its own to the scheduler, each told its index when it runs; a refusal creates none of them."""

from __future__ import annotations

from apps.jobs import services
from apps.jobs.models import Job, JobEvent
from apps.jobs.scheduler import scheduler_pass
from tests.conftest import train_spec
from workers.protocol import ArrayTask


def test_an_array_is_queued_as_its_tasks_alike_but_for_their_index(world, client_for):
    client = client_for(world.member)
    created = client.post("/api/v1/jobs/", train_spec(name="sweep", array_size=3, max_steps=40), format="json")
    assert created.status_code == 201, created.content
    first = created.json()
    assert (first["array_id"], first["array_index"], first["array_size"]) == (first["id"], 0, 3)
    ids = first["array_job_ids"]
    assert len(ids) == 3 and ids[0] == first["id"]
    listed = sorted(client.get(f"/api/v1/jobs/?array={first['id']}").json()["results"], key=lambda j: j["array_index"])
    assert [job["id"] for job in listed] == ids
    assert [job["array_index"] for job in listed] == [0, 1, 2]
    assert {(job["name"], job["state"], job["max_steps"], job["array_id"], job["array_size"]) for job in listed} == {
        ("sweep", "queued", 40, first["id"], 3)}
    assert JobEvent.objects.filter(job_id__in=ids, to_state="queued").count() == 3
    bad = client.get("/api/v1/jobs/?array=1.5")
    assert bad.status_code == 400 and "array" in bad.json()
    # Each task is a job of its own: the scheduler places it, and its dispatch says which task it is.
    scheduler_pass()
    for index, job_id in enumerate(ids):
        job = Job.objects.get(pk=job_id)
        assert job.state == "placed"
        [(_, dispatch)] = services.dispatch_messages(job)
        assert dispatch.array == ArrayTask(array_id=first["id"], index=index, size=3)


def test_a_job_submitted_alone_is_no_array(world, client_for):
    created = client_for(world.member).post("/api/v1/jobs/", train_spec(), format="json").json()
    assert (created["array_id"], created["array_index"], created["array_size"]) == (None, None, None)
    assert "array_job_ids" not in created
    scheduler_pass()
    [(_, dispatch)] = services.dispatch_messages(Job.objects.get(pk=created["id"]))
    assert dispatch.array is None


def test_the_tasks_of_an_array_count_against_the_submission_rate_and_a_refusal_queues_none(world, client_for, settings):
    settings.JOBS_SUBMIT_PER_MINUTE = 4
    client = client_for(world.member)
    for _ in range(2):
        assert client.post("/api/v1/jobs/", train_spec(), format="json").status_code == 201
    refused = client.post("/api/v1/jobs/", train_spec(array_size=3), format="json")
    assert refused.status_code == 429 and "asked for 3 more" in refused.json()["detail"]
    assert Job.objects.count() == 2 and JobEvent.objects.count() == 2
    assert client.post("/api/v1/jobs/", train_spec(array_size=2), format="json").status_code == 201
    assert Job.objects.count() == 4


def test_an_array_is_cancelled_by_its_tasks_ids(world, client_for):
    client = client_for(world.member)
    ids = client.post("/api/v1/jobs/", train_spec(array_size=4), format="json").json()["array_job_ids"]
    done = client.post("/api/v1/jobs/cancel/", {"ids": ids}, format="json").json()
    assert done["cancelled"] == 4
    assert set(Job.objects.filter(array_id=ids[0]).values_list("state", flat=True)) == {"cancelled"}


def test_a_tasks_page_says_which_task_of_which_array_it_is(world, client_for):
    from django.test import Client

    ids = client_for(world.member).post("/api/v1/jobs/", train_spec(array_size=2), format="json").json()["array_job_ids"]
    browser = Client()
    browser.force_login(world.member)
    page = browser.get(f"/jobs/{ids[1]}/").content.decode()
    assert f"task 1 (<code>CONSOLE_ARRAY_TASK_ID</code>) of 2 in job array {ids[0]}" in page
    assert f'href="/jobs/?array={ids[0]}&amp;ordering=submitted">all its tasks</a>' in page
    alone = client_for(world.member).post("/api/v1/jobs/", train_spec(), format="json").json()["id"]
    listing = browser.get(f"/jobs/?array={ids[0]}").content.decode()
    assert f'href="/jobs/{ids[1]}/">resnet[1]</a>' in listing and f'href="/jobs/{ids[0]}/">resnet[0]</a>' in listing
    assert f'href="/jobs/{alone}/"' not in listing and f'href="/jobs/{alone}/"' in browser.get("/jobs/").content.decode()
    assert 'id="job-array"' not in browser.get(f"/jobs/{alone}/").content.decode()


def test_an_array_with_a_parallelism_holds_at_most_that_many_gpus_sets_at_once(world, client_for):
    client = client_for(world.member)
    first = client.post("/api/v1/jobs/", train_spec(array_size=5, array_parallelism=2), format="json").json()
    ids = first["array_job_ids"]
    assert first["array_parallelism"] == 2
    scheduler_pass()  # 16 GPUs free: only the two lowest indices start
    states = dict(Job.objects.filter(array_id=ids[0]).values_list("array_index", "state"))
    assert states == {0: "placed", 1: "placed", 2: "queued", 3: "queued", 4: "queued"}
    held = Job.objects.get(pk=ids[2])
    assert held.pending_reason == (
        f"job array {ids[0]} runs at most 2 of its tasks at once: waiting for its turn (lowest index first)")
    assert (held.queue_position, held.estimated_start) == (None, None)
    services.job_finish(ids[0], succeeded=True, exit_code=0, reason="exited with code 0")
    scheduler_pass()  # one ended: the next index takes its turn
    states = dict(Job.objects.filter(array_id=ids[0]).values_list("array_index", "state"))
    assert states == {0: "succeeded", 1: "placed", 2: "placed", 3: "queued", 4: "queued"}
    # A job submitted alone, or an array without a parallelism, is not held.
    other = client.post("/api/v1/jobs/", train_spec(array_size=3), format="json").json()["array_job_ids"]
    scheduler_pass()
    assert set(Job.objects.filter(pk__in=other).values_list("state", flat=True)) == {"placed"}


def test_a_parallelism_without_an_array_is_refused_naming_it(world, client_for):
    refused = client_for(world.member).post("/api/v1/jobs/", train_spec(array_parallelism=2), format="json")
    assert refused.status_code == 400 and "array_parallelism" in refused.json()
    assert not Job.objects.exists()
