"""The pages' live code against the websocket contract, with a fake WebSocket in the page (the live server is WSGI)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import Job, JobLogChunk
from tests.dashboard.conftest import hold, make_job

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FAKE_WEBSOCKET = """
window.__sockets = [];
window.WebSocket = function (url) {
  var self = this;
  this.url = url;
  window.__sockets.push(this);
  setTimeout(function () { if (self.onopen) { self.onopen(); } }, 0);
};
window.WebSocket.prototype.send = function () {};
window.WebSocket.prototype.close = function () { if (this.onclose) { this.onclose(); } };
window.__emit = function (msg) {
  window.__sockets.forEach(function (s) { if (s.onmessage) { s.onmessage({data: JSON.stringify(msg)}); } });
};
"""


def sample(gpu, **values):
    base = {"host": gpu.host.name, "index": gpu.index, "uuid": gpu.uuid, "gpu_type": gpu.gpu_type,
            "simulated": True, "available": True, "utilization_pct": None, "memory_used_mb": None,
            "memory_total_mb": 143771, "temperature_c": None, "power_w": None, "health": "ok", "job": None,
            "team": None, "ts": time.time()}
    base.update(values)
    return base


def test_overview_applies_samples_queue_and_alerts(world, page_for):
    page = page_for(world.member)
    page.add_init_script(FAKE_WEBSOCKET)
    page.goto("/")
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")
    assert page.evaluate("window.__sockets[0].url") .endswith("/ws/cluster/")
    assert page.evaluate("window.__sockets[0].url").startswith("ws://")
    g = world.gpus
    gpus = [sample(gpu) for gpu in g]
    gpus[0] = sample(g[0], utilization_pct=91.5, memory_used_mb=40960, temperature_c=70, power_w=600, job=7,
                     team="vision")
    gpus[1] = sample(g[1], utilization_pct=0, memory_used_mb=0, temperature_c=30, power_w=60)
    # Another team's job, as the server sends it to this member (apps/accounts/access.py: no id, no team).
    gpus[8] = sample(g[8], utilization_pct=50, other_team=True, health="hot")
    gpus[9] = sample(g[9], available=False)
    page.evaluate("msg => window.__emit(msg)", {"type": "gpu.sample", "ts": time.time(), "gpus": gpus})
    first = page.get_by_label("node-a GPU 0")
    assert "92 %" in first.inner_text() and "40.0/140.4 GiB" in first.inner_text() and "600 W" in first.inner_text()
    assert "heat-4" in first.get_attribute("class")
    assert first.get_by_role("link", name="job 7").get_attribute("href") == "/jobs/7/"
    second = page.get_by_label("node-a GPU 1").inner_text()
    assert "0 %" in second and "30 °C" in second  # a real zero is shown as zero
    assert "no data" in page.get_by_label("node-a GPU 2").inner_text()  # null is never 0 %
    foreign = page.get_by_label("node-b GPU 0")
    assert "another team's job" in foreign.inner_text() and "nlp" not in foreign.inner_text()
    # Its own GPU page is linked (history, health); another team's job is not.
    assert ["/jobs/" in (link.get_attribute("href") or "") for link in foreign.get_by_role("link").all()] == [False]
    assert "hot" in foreign.inner_text()
    assert "status-down" in page.get_by_label("node-b GPU 1").get_attribute("class")
    assert [page.locator(f"#t-{k}").inner_text() for k in ("busy", "idle", "down")] == ["2", "13", "1"]

    page.evaluate("msg => window.__emit(msg)", {"type": "queue", "teams": {"vision": 3, "nlp": 0}})
    assert page.locator("#t-queue").inner_text().strip() == "vision 3"
    page.evaluate("msg => window.__emit(msg)", {"type": "alert", "alert": {
        "id": 1, "state": "firing", "severity": "critical", "message": "GPU too hot", "host": "node-a", "gpu": 0,
        "job": None, "team": None, "started_at": "2026-11-30T10:00:00Z"}})
    assert "GPU too hot" in page.locator("#toasts").inner_text()
    assert page.locator("#t-alerts").inner_text() == "1"


def test_overview_shows_a_silent_hosts_gpus_stale_and_the_servers_counters(world, page_for):
    page = page_for(world.member)
    page.add_init_script(FAKE_WEBSOCKET)
    page.goto("/")
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")
    g = world.gpus
    gpus = [sample(gpu, utilization_pct=50, job=7, team="vision", stale=False, host_status="up") for gpu in g[:8]]
    # node-b went silent: no readings, no job, no health; then the reaper marks it down.
    gpus += [sample(gpu, stale=True, host_status="stale", available=None, health=None, memory_total_mb=None,
                    last_seen=time.time() - 40) for gpu in g[8:]]
    hosts = [{"name": "node-a", "state": "up", "status": "up"}, {"name": "node-b", "state": "up", "status": "stale"}]
    counts = {"hosts": {"up": 1, "draining": 0, "stale": 1, "down": 0},
              "gpus": {"busy": 8, "idle": 0, "stale": 8, "down": 0}}
    page.evaluate("msg => window.__emit(msg)", {"type": "gpu.sample", "ts": time.time(), "gpus": gpus,
                                                 "hosts": hosts, "counts": counts})
    silent = page.get_by_label("node-b GPU 0")
    assert "status-stale" in silent.get_attribute("class") and "heat-none" in silent.get_attribute("class")
    assert "no live data" in silent.inner_text() and "stale" in silent.inner_text() and "50 %" not in silent.inner_text()
    assert page.locator('section[data-host="node-b"] [data-f="host-status"]').inner_text() == "stale"
    assert [page.locator(f"#t-{k}").inner_text() for k in ("busy", "idle", "stale", "down", "gpus")] == \
        ["8", "0", "8", "0", "16"]
    assert [page.locator(f"#t-hosts-{k}").inner_text() for k in ("up", "stale", "down")] == ["1", "1", "0"]

    for entry in gpus[8:]:
        entry["host_status"] = "down"
    hosts[1]["status"] = "down"
    counts = {"hosts": {"up": 1, "draining": 0, "stale": 0, "down": 1},
              "gpus": {"busy": 8, "idle": 0, "stale": 0, "down": 8}}
    page.evaluate("msg => window.__emit(msg)", {"type": "gpu.sample", "ts": time.time(), "gpus": gpus,
                                                 "hosts": hosts, "counts": counts})
    assert "status-down" in silent.get_attribute("class") and "host down" in silent.inner_text()
    assert page.locator('section[data-host="node-b"] [data-f="host-status"]').inner_text() == "down"
    assert [page.locator(f"#t-hosts-{k}").inner_text() for k in ("up", "stale", "down")] == ["1", "0", "1"]
    assert page.locator("#t-down").inner_text() == "8"


def test_ring_buffer_keeps_a_fixed_size(world, page_for):
    page = page_for(world.member)
    page.goto("/")
    result = page.evaluate("""() => {
        const r = new GC.Ring(900);
        for (let i = 0; i < 100000; i++) { r.push(i, i % 100); }
        const values = [];
        r.forEach((t, v) => values.push(t));
        return [r.length, r.t.length, values[0], values[values.length - 1], r.last().t];
    }""")
    assert result == [900, 900, 99100, 99999, 99999]


def test_job_page_follows_log_progress_and_state(world, page_for):
    job = make_job(world.vision, world.member, state=Job.State.RUNNING, placed_at=timezone.now())
    hold(job, world.gpus[:1], timezone.now() - timedelta(minutes=1))
    JobLogChunk.objects.create(job=job, offset=0, data="hello\n")
    Job.objects.filter(pk=job.pk).update(log_size=6)
    page = page_for(world.member)
    page.add_init_script(FAKE_WEBSOCKET)
    page.goto(f"/jobs/{job.pk}/")
    page.wait_for_function("document.getElementById('live-status').dataset.state === 'live'")
    assert page.evaluate("window.__sockets[0].url").endswith(f"/ws/jobs/{job.pk}/")
    emit = "msg => window.__emit(msg)"
    page.evaluate(emit, {"type": "job.log", "offset": 6, "data": "step 1\n"})
    page.evaluate(emit, {"type": "job.log", "offset": 0, "data": "hello\nstep 1\n"})  # repeated: not doubled
    page.evaluate(emit, {"type": "job.log", "offset": 13, "data": "step 2\n"})
    assert page.locator("#job-log").inner_text() == "hello\nstep 1\nstep 2\n"
    for step in range(1, 6):
        page.evaluate(emit, {"type": "job.progress", "step": step * 10, "loss": 1.0 / step, "steps_per_s": 12.5,
                             "samples_per_s": 400, "ts": time.time() + step})
    assert page.locator("#job-steps").inner_text() == "50"
    assert page.locator("#job-sps").inner_text() == "12.5"
    page.evaluate(emit, {"type": "gpu.sample", "ts": time.time(), "gpus": [sample(world.gpus[0], utilization_pct=80)]})
    assert page.locator("#gpu-charts figure .uplot").count() == 4  # one uPlot chart per metric
    page.evaluate(emit, {"type": "job.state", "job": {"id": job.pk, "state": "cancelled", "team": "vision",
                                                      "pending_reason": ""}})
    assert page.locator("#job-state").inner_text() == "cancelled"
    assert page.locator("#cancel-form").is_hidden()
    assert "cancelled" in page.locator("#toasts").inner_text()
