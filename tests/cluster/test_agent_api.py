"""The agent API: host tokens, registration, heartbeats, and what a host may report (only its own jobs)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.cluster.models import GPU, Host
from apps.cluster.services import host_token_issue
from apps.jobs.agent_reports import LATE_OUTPUT_S
from apps.jobs.lifecycle import job_cancel
from apps.jobs.models import Job, JobLogChunk
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from apps.operations.liveness import jobs_on_lost_hosts
from workers.protocol import PROTOCOL_VERSION


def agent(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Host {secret}")
    return client


def registration(name: str, gpus: int = 2, **extra) -> dict:
    return {
        "host": name, "agent_version": "0.1.0", "protocol": PROTOCOL_VERSION, "simulated": True,
        "gpus": [{"index": i, "uuid": f"GPU-sim-{name}-{i}", "name": "Simulated NVIDIA H200", "gpu_type": "H200",
                  "memory_mb": 143771} for i in range(gpus)],
        **extra,
    }


@pytest.fixture
def host_a(db):
    host, secret = host_token_issue(name="sim-a")
    response = agent(secret).post("/api/v1/agent/register/", registration("sim-a"), format="json")
    assert response.status_code == 200, response.content
    return Host.objects.get(name="sim-a"), secret


def submit(user, gpus=1, team="vision", kind="train", **extra) -> Job:
    return job_submit(user=user, spec=JobSpec(name="t", kind=kind, gpus=gpus, team=team,
                                              workload={"builtin": "mlp-digits"}, **extra))


def test_token_is_stored_hashed(db):
    host, secret = host_token_issue(name="n1")
    assert secret not in host.credential.digest
    _, second = host_token_issue(name="n1")
    assert agent(secret).post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 401
    assert agent(second).post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 200


def test_registration_creates_gpus_and_marks_up(host_a):
    host, _ = host_a
    assert host.state == "up" and host.simulated and host.gpus.count() == 2
    assert set(host.gpus.values_list("gpu_type", flat=True)) == {"H200"}


def test_registration_errors(host_a):
    _, secret = host_a
    client = agent(secret)
    wrong_protocol = client.post("/api/v1/agent/register/", registration("sim-a", protocol=99), format="json")
    assert wrong_protocol.status_code == 409 and "protocol" in wrong_protocol.json()["detail"]
    other_host = client.post("/api/v1/agent/register/", registration("sim-b"), format="json")
    assert other_host.status_code == 409 and "belongs to host" in other_host.json()["detail"]
    assert not Host.objects.filter(name="sim-b").exists()
    assert client.post("/api/v1/agent/register/", {"host": "sim-a"}, format="json").status_code == 400


def test_a_gpu_gone_from_registration_takes_no_work(host_a):
    _, secret = host_a
    agent(secret).post("/api/v1/agent/register/", registration("sim-a", gpus=1), format="json")
    assert GPU.objects.get(host__name="sim-a", index=1).health == "faulty"


def test_user_tokens_and_host_tokens_do_not_cross(world, host_a, client_for):
    _, secret = host_a
    assert agent(secret).get("/api/v1/jobs/").status_code == 401
    assert client_for(world.admin).post("/api/v1/agent/heartbeat/", {}, format="json").status_code in {401, 403}
    assert APIClient().post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 401


def test_full_job_lifecycle_through_the_agent_api(world, host_a, client_for):
    Host.objects.exclude(name="sim-a").update(state="down")
    host, secret = host_a
    job = submit(world.member, gpus=2)
    scheduler_pass()
    job.refresh_from_db()
    assert job.state == "placed" and job.attempts == 1
    client = agent(secret)
    base = f"/api/v1/agent/jobs/{job.pk}"
    claim = client.post(f"{base}/status/", {"state": "running", "attempt": 1}, format="json")
    assert claim.json() == {"state": "running", "accepted": True}
    again = client.post(f"{base}/status/", {"state": "running", "attempt": 1}, format="json")
    assert again.json()["accepted"] is False  # a redelivered dispatch claims nothing
    stale = client.post(f"{base}/status/", {"state": "running", "attempt": 0}, format="json")
    assert stale.status_code == 409
    assert client.post(f"{base}/logs/", {"attempt": 1, "data": "epoch 1 loss 2.3\n"}, format="json").status_code == 200
    assert client.post(f"{base}/logs/", {"attempt": 1, "data": "épöch 2 loss 1.1\n"}, format="json").json()["size"] == 34
    client.post(f"{base}/progress/", {"attempt": 1, "progress": {"step": 20, "loss": 1.1, "steps_per_s": 4.5,
                                                                "samples_per_s": 288.0}}, format="json")
    user = client_for(world.member)
    logs = user.get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert logs == {"data": "epoch 1 loss 2.3\népöch 2 loss 1.1\n", "next": 34, "complete": False, "truncated": False}
    assert user.get(f"/api/v1/jobs/{job.pk}/logs/?after=17").json()["data"] == "épöch 2 loss 1.1\n"
    assert user.get(f"/api/v1/jobs/{job.pk}/logs/?after=20").json()["data"] == "ch 2 loss 1.1\n"
    done = client.post(f"{base}/status/", {"state": "succeeded", "attempt": 1, "exit_code": 0}, format="json")
    assert done.json()["state"] == "succeeded"
    detail = user.get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["exit_code"] == 0 and detail["steps_done"] == 20 and detail["steps_per_second"] == 4.5
    assert user.get(f"/api/v1/jobs/{job.pk}/logs/?after=34").json()["complete"] is True
    assert [e["to_state"] for e in user.get(f"/api/v1/jobs/{job.pk}/events/").json()["results"]] == [
        "queued", "placed", "running", "succeeded"]


def running_on_sim_a(world, host_a):
    """A member's one-GPU job placed on sim-a (the only host up) and claimed running by its agent: (job, the
    agent's client, the job's agent API path)."""
    Host.objects.exclude(name="sim-a").update(state="down")
    job = submit(world.member)
    scheduler_pass()
    client = agent(host_a[1])
    base = f"/api/v1/agent/jobs/{job.pk}"
    client.post(f"{base}/status/", {"state": "running", "attempt": 1}, format="json")
    return job, client, base


def test_a_log_chunk_sent_again_is_stored_once(world, host_a, client_for):
    job, client, base = running_on_sim_a(world, host_a)

    def post(**body: object) -> int:
        answer = client.post(f"{base}/logs/", {"attempt": 1, **body}, format="json")
        assert answer.status_code == 200, answer.content
        return answer.json()["size"]

    assert post(data="abc", offset=0) == 3
    assert post(data="abcd", offset=0) == 4  # its answer was lost; sent again with what came after it
    assert post(data="ef", offset=4) == post(data="ef", offset=4) == 6
    assert post(data="xy", offset=9) == 8  # past what it holds (the agent skipped a chunk it refused): taken whole
    assert post(data="old agent\n") == 18  # no offset: appended as it comes
    # The agent restarted while the attempt was placed: its new sender's output counts from 0 again.
    assert post(data="again\n", offset=0, stream="b2") == post(data="again\n", offset=0, stream="b2") == 24
    logs = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/logs/").json()
    assert logs["data"] == "abcdefxyold agent\nagain\n"
    bad = client.post(f"{base}/logs/", {"attempt": 1, "data": "x", "offset": -1}, format="json")
    assert bad.status_code == 400 and "offset" in bad.json()
    bad = client.post(f"{base}/logs/", {"attempt": 1, "data": "x", "offset": 0, "stream": "a/b"}, format="json")
    assert bad.status_code == 400 and "stream" in bad.json()


def test_what_a_cancelled_job_prints_while_it_stops_is_still_taken_from_its_host_for_a_while(
        world, host_a, client_for):
    job, client, base = running_on_sim_a(world, host_a)
    assert client.post(f"{base}/logs/", {"attempt": 1, "data": "step 41\n", "offset": 0}, format="json").status_code == 200
    job_cancel(job=job, actor=world.member)  # GPUs released at once; the job gets SIGTERM and its grace
    late = client.post(f"{base}/logs/", {"attempt": 1, "data": "checkpoint saved at step 42\n", "offset": 8},
                       format="json")
    assert late.status_code == 200, late.content
    assert client_for(world.member).get(f"/api/v1/jobs/{job.pk}/logs/").json()["data"] == (
        "step 41\ncheckpoint saved at step 42\n")
    # Its output only: the report of its end does not change the ended job.
    ended = client.post(f"{base}/status/", {"state": "succeeded", "attempt": 1, "exit_code": 0}, format="json")
    assert ended.status_code == 409 and Job.objects.get(pk=job.pk).state == "cancelled"
    # Another host never ran it; an attempt it never had; and after LATE_OUTPUT_S, nothing more.
    _, other = host_token_issue(name="sim-b")
    agent(other).post("/api/v1/agent/register/", registration("sim-b"), format="json")
    assert agent(other).post(f"{base}/logs/", {"attempt": 1, "data": "x"}, format="json").status_code == 409
    assert client.post(f"{base}/logs/", {"attempt": 2, "data": "x"}, format="json").status_code == 409
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(seconds=LATE_OUTPUT_S + 1))
    assert client.post(f"{base}/logs/", {"attempt": 1, "data": "x"}, format="json").status_code == 409


def test_a_host_may_report_only_its_own_jobs(world, host_a):
    Host.objects.exclude(name="sim-a").update(state="down")
    job = submit(world.member)
    scheduler_pass()
    _, intruder = host_token_issue(name="sim-b")
    agent(intruder).post("/api/v1/agent/register/", registration("sim-b"), format="json")
    client = agent(intruder)
    for path, body in [("status/", {"state": "failed", "attempt": 1}), ("logs/", {"attempt": 1, "data": "x"}),
                       ("progress/", {"attempt": 1, "progress": {"step": 1}})]:
        assert client.post(f"/api/v1/agent/jobs/{job.pk}/{path}", body, format="json").status_code == 409
    job.refresh_from_db()
    assert job.state == "placed" and not JobLogChunk.objects.exists()


def test_failure_and_log_cap(world, host_a, settings, client_for):
    settings.JOBS_LOG_MAX_CHARS = 1000
    job, client, base = running_on_sim_a(world, host_a)
    for _ in range(5):
        client.post(f"{base}/logs/", {"attempt": 1, "data": "y" * 400}, format="json")
    job.refresh_from_db()
    assert job.log_truncated and 1000 <= job.log_size < 1100
    client.post(f"{base}/status/", {"state": "failed", "attempt": 1, "exit_code": 3, "reason": "exited with code 3"},
                format="json")
    body = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["state"] == "failed" and body["exit_code"] == 3 and body["failure_reason"] == "exited with code 3"


def test_heartbeat_tells_the_agent_what_to_stop(world, host_a, client_for):
    Host.objects.exclude(name="sim-a").update(state="down")
    keep, cancel = submit(world.member), submit(world.member)
    scheduler_pass()
    client = agent(host_a[1])
    client_for(world.member).post(f"/api/v1/jobs/{cancel.pk}/cancel/", {}, format="json")
    reply = client.post("/api/v1/agent/heartbeat/", {"running": [[keep.pk, 1], [cancel.pk, 1], [9999, 1]]},
                        format="json").json()
    assert sorted(reply["stop"]) == sorted([[cancel.pk, 1], [9999, 1]])


def test_lost_host_requeues_within_retries_then_fails(world, host_a):
    from datetime import timedelta

    from django.utils import timezone

    Host.objects.exclude(name="sim-a").update(state="down")
    retried = submit(world.member, max_retries=1)
    once = submit(world.member)
    scheduler_pass()
    Host.objects.filter(name="sim-a").update(last_heartbeat=timezone.now() - timedelta(seconds=31))
    outcomes = dict(jobs_on_lost_hosts())
    assert outcomes == {retried.pk: "queued", once.pk: "failed"}
    retried.refresh_from_db()
    once.refresh_from_db()
    assert "retry 1 of 1" in retried.events.last().reason and "host lost" in retried.events.last().reason
    assert once.failure_reason.startswith("host lost")
    assert Host.objects.get(name="sim-a").state == "down"
    # The host comes back: heartbeats mark it up, the requeued job runs again as attempt 2, then fails for good.
    agent(host_a[1]).post("/api/v1/agent/heartbeat/", {}, format="json")
    scheduler_pass()
    retried.refresh_from_db()
    assert retried.state == "placed" and retried.attempts == 2
    Host.objects.filter(name="sim-a").update(last_heartbeat=timezone.now() - timedelta(seconds=31))
    assert dict(jobs_on_lost_hosts()) == {retried.pk: "failed"}


def test_a_running_job_the_agent_no_longer_lists_is_requeued_or_failed(world, host_a):
    from datetime import timedelta

    from django.utils import timezone

    Host.objects.exclude(name="sim-a").update(state="down")
    job = submit(world.member)
    scheduler_pass()
    client = agent(host_a[1])
    client.post(f"/api/v1/agent/jobs/{job.pk}/status/", {"state": "running", "attempt": 1}, format="json")
    client.post("/api/v1/agent/heartbeat/", {"running": []}, format="json")
    job.refresh_from_db()
    assert job.state == "running"  # just started: the agent may not list it yet
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=60))
    client.post("/api/v1/agent/heartbeat/", {"running": [[job.pk, 1]]}, format="json")
    job.refresh_from_db()
    assert job.state == "running"
    client.post("/api/v1/agent/heartbeat/", {"running": []}, format="json")
    job.refresh_from_db()
    assert job.state == "failed" and "no longer runs it" in job.failure_reason


def _running_job(world, secret, **extra) -> tuple[Job, str]:
    Host.objects.exclude(name="sim-a").update(state="down")
    job = submit(world.member, **extra)
    scheduler_pass()
    base = f"/api/v1/agent/jobs/{job.pk}"
    assert agent(secret).post(f"{base}/status/", {"state": "running", "attempt": 1}, format="json").status_code == 200
    return job, base


def test_the_record_shows_the_run_average_and_the_last_interval(world, host_a, client_for):
    _, secret = host_a
    job, base = _running_job(world, secret)
    progress = {"step": 300, "steps_per_s": 9.75, "samples_per_s": 624.0, "avg_steps_per_s": 4.47,
                "avg_samples_per_s": 286.1}
    agent(secret).post(f"{base}/progress/", {"attempt": 1, "progress": progress}, format="json")
    detail = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (detail["steps_per_second"], detail["samples_per_second"]) == (4.47, 286.1)
    assert (detail["last_steps_per_second"], detail["last_samples_per_second"]) == (9.75, 624.0)
    result = {"type": "result", "kind": "train", "steps_per_s": 4.4, "samples_per_s": 281.6, "steps": 320}
    agent(secret).post(f"{base}/progress/", {"attempt": 1, "progress": result}, format="json")
    detail = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (detail["steps_per_second"], detail["samples_per_second"]) == (4.4, 281.6)


def test_an_inference_job_gets_its_figures_from_its_result(world, host_a, client_for):
    _, secret = host_a
    job, base = _running_job(world, secret, kind="inference", preset="infer-fp32")
    result = {"type": "result", "kind": "inference", "batches": 40, "latency_ms_mean": 12.5, "samples": 2560,
              "throughput_samples_per_s": 5120.0}
    agent(secret).post(f"{base}/progress/", {"attempt": 1, "progress": result}, format="json")
    detail = client_for(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (detail["steps_per_second"], detail["samples_per_second"]) == (80.0, 5120.0)
