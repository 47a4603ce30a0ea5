"""A job's kept metrics: every training record the agent forwards is stored per series (loss, rates and the job's
own named metrics), thinned evenly past JOBS_METRIC_POINTS, served by GET /api/v1/jobs/{id}/metrics/ to those
who may see the job; hostile names and values are dropped and counted, never a 500."""

from __future__ import annotations

import time

from apps.jobs.metrics import MAX_SERIES_PER_JOB
from apps.jobs.models import Job, JobMetric, JobMetricSeries
from tests.cluster.test_agent_api import agent
from tests.jobs.test_job_api import job_client, running  # noqa: F401 - a fixture
from workers.protocol import MAX_DROPPED


def post_records(job: Job, secret: str, records: list[dict]) -> None:
    response = agent(secret).post(f"/api/v1/agent/jobs/{job.pk}/progress/", {"attempt": 1, "records": records},
                                  format="json")
    assert response.status_code == 200, response.content


def record(step: int, **metrics: float) -> dict:
    return {"type": "progress", "step": step, "max_steps": 1000, "loss": 2.0 / (step + 1), "steps_per_s": 5.0,
            "samples_per_s": 320.0, "ts": time.time(), **({"metrics": metrics} if metrics else {})}


def series_of(body: dict) -> dict[str, dict]:
    return {s["name"]: s for s in body["series"]}


def test_every_record_and_a_custom_metric_are_kept_and_served_to_those_who_see_the_job(
        running, world, client_for):  # noqa: F811
    job, _, secret = running
    post_records(job, secret, [record(step, **({"val_acc": step / 100} if step % 10 == 0 else {}))
                               for step in range(1, 51)])
    post_records(job, secret, [record(step) for step in range(51, 61)])
    body = client_for(world.viewer).get(f"/api/v1/jobs/{job.pk}/metrics/").json()
    series = series_of(body)
    assert set(series) == {"loss", "steps_per_s", "samples_per_s", "val_acc"}
    assert series["loss"]["steps"] == list(range(1, 61)) and series["loss"]["builtin"] is True
    assert series["loss"]["values"][0] == 1.0 and series["loss"]["seen"] == 60
    assert series["val_acc"] == {**series["val_acc"], "builtin": False, "steps": [10, 20, 30, 40, 50],
                                 "values": [0.1, 0.2, 0.3, 0.4, 0.5]}
    assert len(series["val_acc"]["times"]) == 5 and all(t > 0 for t in series["val_acc"]["times"])
    assert body["progress"] == {"step": 60, "max_steps": job.max_steps, "percent": body["progress"]["percent"],
                                "eta_s": body["progress"]["eta_s"], "steps_per_s": 5.0, "loss": 2.0 / 61}
    assert body["dropped"] == 0 and body["state"] == "running"

    only = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/metrics/?name=val_acc,loss&since_step=45").json()
    assert [s["name"] for s in only["series"]] == ["loss", "val_acc"]
    assert series_of(only)["loss"]["steps"] == list(range(46, 61)) and series_of(only)["val_acc"]["steps"] == [50]
    assert client_for(world.other).get(f"/api/v1/jobs/{job.pk}/metrics/").status_code == 404
    assert client_for(world.noteam).get(f"/api/v1/jobs/{job.pk}/metrics/").status_code == 404
    assert client_for(None).get(f"/api/v1/jobs/{job.pk}/metrics/").status_code in (401, 403)


def test_a_long_run_is_thinned_evenly_to_the_bound_keeping_the_first_and_newest(running, settings):  # noqa: F811
    job, _, secret = running
    settings.JOBS_METRIC_POINTS = 50
    for batch in range(12):
        post_records(job, secret, [record(step) for step in range(batch * 97, (batch + 1) * 97)])
        steps = list(JobMetric.objects.filter(series__job=job, series__name="loss").values_list("step", flat=True))
        assert len(steps) <= 50
    series = JobMetricSeries.objects.get(job=job, name="loss")
    assert series.seen == 12 * 97 and series.stride == 32
    seqs = list(series.points.values_list("seq", flat=True))
    assert seqs[0] == 0 and seqs[-1] == 12 * 97 - 1  # the first and the newest
    assert all(seq % 32 == 0 for seq in seqs[:-1]) and len(seqs) == -(-12 * 97 // 32) + 1
    assert steps == seqs  # steps here are 0, 1, 2...: what is kept is evenly spread over the run


def test_hostile_names_and_values_are_dropped_and_counted_never_a_500(running, world, client_for):  # noqa: F811
    job, _, secret = running
    hostile = [
        {"type": "progress", "step": 1, "metrics": {"val acc": 1.0, "x" * 65: 1.0, "<script>": 2.0, "loss": 9.0,
                                                     "ok": 0.5, "text": "1.0", "flag": True, "big": 1e300,
                                                     "nested": {"a": 1}, "nothing": None}},
        {"type": "progress", "step": 2, "metrics": ["not", "a", "dict"]},
        {"type": "progress", "step": 3, "metrics": {str(i): 1.0 for i in range(40)}},  # names start with a digit
        {"type": "progress", "step": 4, "metrics": {f"m{i}": 1.0 for i in range(40)}},  # 32 kept a record
        {"type": "progress", "step": "five", "loss": "low", "metrics": {"ok": 0.6}},
        {"step": 6, "dropped_metrics": -3},
        {"type": "progress", "step": 2**80, "metrics": {"ok": 0.7}},  # no step a database keeps
        "not an object",
    ]
    response = agent(secret).post(f"/api/v1/agent/jobs/{job.pk}/progress/", {"attempt": 1, "records": hostile},
                                  format="json")
    assert response.status_code == 400 and "records" in response.json()  # a list of objects, said so
    post_records(job, secret, hostile[:-1])
    body = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/metrics/").json()
    series = series_of(body)
    assert series["ok"]["steps"] == [1, None, None] and series["ok"]["values"] == [0.5, 0.6, 0.7]
    assert "loss" not in series  # no record had a usable loss; the metric named loss was dropped
    assert len([name for name in series if name.startswith("m")]) == 32
    assert body["dropped"] == 9 + 1 + 40 + 8
    job.refresh_from_db()
    assert job.metrics_dropped == body["dropped"] and job.steps_done == 6
    post_records(job, secret, [{"type": "progress", "step": 7, "dropped_metrics": 10**30}] * 500)
    job.refresh_from_db()
    assert job.metrics_dropped == body["dropped"] + 500 * MAX_DROPPED  # what a record claims is capped


def test_a_job_names_at_most_so_many_series(running):  # noqa: F811
    job, _, secret = running
    for start in range(0, 80, 20):
        post_records(job, secret, [{"type": "progress", "step": 1,
                                    "metrics": {f"s{i:02}": 1.0 for i in range(start, start + 20)}}])
    assert JobMetricSeries.objects.filter(job=job).count() == MAX_SERIES_PER_JOB
    job.refresh_from_db()
    assert job.metrics_dropped == 80 - MAX_SERIES_PER_JOB


def test_the_query_is_checked_field_by_field(running, world, client_for):  # noqa: F811
    job, _, _ = running
    user = client_for(world.member)
    bad_name = user.get(f"/api/v1/jobs/{job.pk}/metrics/?name=no%20spaces")
    assert bad_name.status_code == 400 and "name" in bad_name.json()
    bad_step = user.get(f"/api/v1/jobs/{job.pk}/metrics/?since_step=-1")
    assert bad_step.status_code == 400 and "since_step" in bad_step.json()
    assert user.get(f"/api/v1/jobs/{job.pk}/metrics/").json()["series"] == []


def test_the_job_api_takes_named_metrics_and_refuses_bad_ones_naming_the_field(running, world, client_for):  # noqa: F811
    job, dispatch, _ = running
    client = job_client(dispatch.job_token)
    ok = client.post("/api/v1/job/progress/", {"step": 7, "loss": 0.5, "metrics": {"val/acc": 0.8}}, format="json")
    assert ok.status_code == 200
    bad = client.post("/api/v1/job/progress/", {"step": 8, "metrics": {"val acc": 0.8, "loss": 1}}, format="json")
    assert bad.status_code == 400 and "metrics" in bad.json()
    series = series_of(client_for(world.member).get(f"/api/v1/jobs/{job.pk}/metrics/").json())
    assert series["val/acc"]["values"] == [0.8] and series["loss"]["steps"] == [7]
