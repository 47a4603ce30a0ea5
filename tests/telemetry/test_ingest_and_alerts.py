from __future__ import annotations

import time

import pytest
from django.core import mail
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from apps.cluster.models import GPU, Host
from apps.cluster.services import host_token_issue
from apps.jobs.models import Job
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_report_status, job_submit
from apps.telemetry import alerts, services
from apps.telemetry.models import Alert, AlertRule, GpuSampleBucket, JobGpuStats
from tests.telemetry.conftest import gpu_sample
from workers.protocol import JobStatus


def send(client: APIClient, gpus: list[dict], xid: list[dict] | None = None):
    return client.post("/api/v1/agent/telemetry/", {"ts": time.time(), "gpus": gpus, "xid": xid or []},
                       format="json")


def run_job_on_sim(world, *, started: bool = False) -> Job:
    """A job placed on the simulated host; `started`: running there too (its agent reported its process up)."""
    Host.objects.exclude(name="sim-t").update(state="down")
    job = job_submit(user=world.member, spec=JobSpec(name="t", kind="train", gpus=1, team="vision",
                                                     workload={"builtin": "mlp-digits"}))
    scheduler_pass()
    if started:
        job_report_status(host=Host.objects.get(name="sim-t"), job_id=job.pk, status=JobStatus("running", 1))
    job.refresh_from_db()
    assert job.state == ("running" if started else "placed")
    services.forget_host_maps()
    return job


def test_a_batch_becomes_the_latest_frame_with_the_console_job_mapping(world, sim_host):
    host, client = sim_host
    job = run_job_on_sim(world)
    response = send(client, [gpu_sample(0, util=88.0), gpu_sample(1, available=False)])
    assert response.status_code == 200, response.content
    frame = services.latest_frames(["sim-t"])["sim-t"]
    by_index = {g["index"]: g for g in frame["gpus"]}
    assert by_index[0]["utilization_pct"] == 88.0 and by_index[0]["job"] == job.pk
    assert by_index[0]["team"] == "vision" and by_index[0]["simulated"] is True
    assert by_index[1]["available"] is False and by_index[1]["utilization_pct"] is None  # no data, never 0 %


@pytest.mark.parametrize("bad", [
    {"gpus": "x"}, {"gpus": [{"uuid": 3}]}, {"gpus": [{"uuid": "GPU-sim-sim-t-0", "ts": "now"}]},
    {"gpus": [dict(gpu_sample(0), utilization_pct="high")]}, {"xid": [{"uuid": "GPU-sim-sim-t-0", "xid": "79"}]},
    [1, 2],
])
def test_malformed_batches_get_400(world, sim_host, bad):
    _, client = sim_host
    response = client.post("/api/v1/agent/telemetry/", bad, format="json")
    assert response.status_code == 400


def test_a_host_may_publish_only_its_own_gpus(world, sim_host):
    _, client = sim_host
    _, other_secret = host_token_issue(name="sim-x")
    intruder = APIClient()
    intruder.credentials(HTTP_AUTHORIZATION=f"Host {other_secret}")
    response = send(intruder, [gpu_sample(0)])  # sim-t's GPU
    assert response.status_code == 400 and "not registered on host sim-x" in response.json()["detail"]
    assert services.latest_frames(["sim-t", "sim-x"]) == {}
    assert APIClient().post("/api/v1/agent/telemetry/", {}, format="json").status_code == 401


def test_buckets_and_job_statistics(world, sim_host):
    _, client = sim_host
    job = run_job_on_sim(world)
    start = (int(time.time()) // 10) * 10 - 60
    from unittest import mock

    for second in range(20):  # as a live agent sends them: each sample at its own "now"
        with mock.patch("apps.telemetry.services.time.time", return_value=start + second + 0.2):
            send(client, [gpu_sample(0, ts=start + second, util=40.0 + second, mem=2000 + second)])
    services.flush_buckets(everything=True)
    rows = GpuSampleBucket.objects.filter(gpu__index=0, resolution_s=10).order_by("bucket_start")
    assert [r.samples for r in rows] == [10, 10]
    assert rows[0].utilization_avg == pytest.approx(44.5) and rows[1].utilization_max == 59.0
    stats = JobGpuStats.objects.get(job=job)
    assert stats.samples == 20 and stats.utilization_mean == pytest.approx(49.5)
    assert stats.memory_max_mb == 2019 and stats.energy_j == pytest.approx(300.0 * 20)


def test_overheating_gpu_fires_after_its_duration_marks_it_hot_and_resolves_when_cool(world, sim_host, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    _, client = sim_host
    from unittest import mock

    # Both samples arrive at a "now" the test sets: a busy machine can take more than the second to spare between
    # the test's clock reading and the first request's.
    now = time.time()
    with mock.patch("apps.telemetry.services.time.time", return_value=now):
        send(client, [gpu_sample(0, ts=now, temp=91)])
    assert not Alert.objects.exists()
    # 31 s later (the default rule's duration is 30 s) it is still hot: the alert fires and the GPU takes no new jobs.
    with mock.patch("apps.telemetry.services.time.time", return_value=now + 31):
        send(client, [gpu_sample(0, ts=now + 31, temp=92)])
    alert = Alert.objects.get()
    assert alert.state == "firing" and "91" not in alert.message and "92 °C" in alert.message
    gpu = GPU.objects.get(uuid="GPU-sim-sim-t-0")
    assert gpu.health == "hot"
    alerts.notify(alert.pk)
    assert mail.outbox and "GPU too hot" in mail.outbox[0].subject
    send(client, [gpu_sample(0, temp=84)])  # within the hysteresis band: still firing
    assert Alert.objects.get().state == "firing"
    send(client, [gpu_sample(0, temp=70)])
    assert Alert.objects.get().state == "resolved"
    gpu.refresh_from_db()
    assert gpu.health == "ok"


def test_xid_fires_at_once_and_marks_the_gpu_faulty(world, sim_host):
    _, client = sim_host
    response = send(client, [], xid=[{"index": 1, "uuid": "GPU-sim-sim-t-1", "xid": 79, "ts": time.time()}])
    assert response.status_code == 200
    alert = Alert.objects.get()
    assert "XID 79" in alert.message and alert.rule.severity == "critical"
    assert GPU.objects.get(uuid="GPU-sim-sim-t-1").health == "faulty"
    scheduler_pass()  # nothing lands on a faulty GPU
    assert not GPU.objects.get(uuid="GPU-sim-sim-t-1").allocations.exists()


def test_idle_release_applies_only_to_the_rules_teams(world, sim_host):
    """A rule scoped to nlp warns vision's idle job (the alert) without a release warning or a release."""
    _, client = sim_host
    job = run_job_on_sim(world, started=True)
    rule = AlertRule.objects.get(kind="job_idle")
    rule.duration_s = 0
    rule.action = AlertRule.Action.RELEASE_JOB
    rule.save()
    rule.teams.add(world.nlp)
    alerts.reload_rules()
    send(client, [gpu_sample(0, util=1.0)])
    alert = Alert.objects.get(rule=rule)
    assert alert.job_id == job.pk and "idle" in alert.message and "released" not in alert.message
    from datetime import timedelta

    from django.utils import timezone

    from apps.telemetry import idle_release

    assert idle_release.release_due(timezone.now() + timedelta(days=1)) == 0
    job.refresh_from_db()
    assert job.state == "running" and not job.events.filter(reason__startswith="warning").exists()


def test_alert_api_visibility_and_acknowledge(world, sim_host, client_for):
    _, client = sim_host
    job = run_job_on_sim(world, started=True)
    rule = AlertRule.objects.get(kind="job_idle")
    rule.duration_s = 0
    rule.save()
    alerts.reload_rules()
    send(client, [gpu_sample(0, util=0.0)], xid=[{"index": 1, "uuid": "GPU-sim-sim-t-1", "xid": 48, "ts": 1.0}])
    idle = Alert.objects.get(rule=rule)
    assert idle.team == world.vision and idle.job_id == job.pk
    seen = {p: {a["id"] for a in client_for(getattr(world, p)).get("/api/v1/alerts/").json()["results"]}
            for p in ["admin", "manager", "viewer", "other", "noteam"]}
    assert idle.pk in seen["admin"] and idle.pk in seen["viewer"] and idle.pk not in seen["other"]
    assert seen["noteam"] == set() and len(seen["other"]) == 1  # the cluster-wide XID alert only
    assert client_for(world.other).post(f"/api/v1/alerts/{idle.pk}/acknowledge/").status_code == 404
    assert client_for(world.viewer).post(f"/api/v1/alerts/{idle.pk}/acknowledge/").status_code == 403
    response = client_for(world.manager).post(f"/api/v1/alerts/{idle.pk}/acknowledge/")
    assert response.status_code == 200 and response.json()["state"] == "acknowledged"
    assert response.json()["acknowledged_by"] == "manny"
    rules_api = client_for(world.manager).get("/api/v1/alert-rules/")
    assert rules_api.status_code == 403
    changed = client_for(world.admin).patch(f"/api/v1/alert-rules/{rule.pk}/", {"threshold": 10}, format="json")
    assert changed.status_code == 200 and changed.json()["threshold"] == 10


def test_metrics_parse_and_need_an_admin_or_the_metrics_token(world, sim_host, client_for, settings):
    _, client = sim_host
    run_job_on_sim(world)
    send(client, [gpu_sample(0, util=77.0), gpu_sample(1, available=False)])
    job_submit(user=world.member, spec=JobSpec(name="q", kind="train", gpus=8, team="vision",
                                               workload={"builtin": "mlp-digits"}))
    assert APIClient().get("/metrics").status_code == 401
    assert client_for(world.member).get("/metrics").status_code == 401
    settings.METRICS_TOKEN = "metrics-secret-for-tests"
    scraper = APIClient()
    scraper.credentials(HTTP_AUTHORIZATION="Bearer metrics-secret-for-tests")
    response = scraper.get("/metrics")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert len(util) == 1 and util[0].value == 77.0
    assert util[0].labels == {"host": "sim-t", "gpu": "0", "uuid": "GPU-sim-sim-t-0", "model": "Simulated NVIDIA H200",
                              "team": "vision", "job": str(Job.objects.order_by("id").first().pk)}
    no_data = {s.labels["gpu"]: s.value for s in families["console_gpu_no_data"].samples}
    assert no_data == {"0": 0.0, "1": 1.0}
    queue = {s.labels["team"]: s.value for s in families["console_queue_length"].samples}
    assert queue == {"vision": 1.0}
    from django.test import Client

    browser = Client()
    browser.force_login(world.admin)
    assert browser.get("/metrics").status_code == 200
    from apps.accounts.services import token_create

    _, secret = token_create(user=world.admin, name="prometheus")
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200
