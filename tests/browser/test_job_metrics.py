"""A finished job's page draws its curves from the stored metrics after a reload (no live report needed), its
own custom metric included, and the compare page draws the runs on one chart; no JavaScript errors."""

from __future__ import annotations

import time

import pytest

from apps.cluster.models import Host
from apps.cluster.services import host_token_issue
from apps.jobs.models import Job
from apps.jobs.scheduler import scheduler_pass
from apps.jobs.services import JobSpec, job_submit
from tests.cluster.test_agent_api import agent, registration

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STEPS = 60
INK = """(name) => {
  const canvas = document.querySelector(`figure[data-metric="${name}"] .uplot canvas`);
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  for (let i = 3; i < pixels.length; i += 4) { if (pixels[i]) { inked += 1; } }
  return inked;
}"""


def finished_job_with_reports(world) -> Job:
    """A job run on host sim-a whose agent forwarded STEPS training records (val_acc every 10 steps), then ended."""
    _, secret = host_token_issue(name="sim-a")
    client = agent(secret)
    assert client.post("/api/v1/agent/register/", registration("sim-a"), format="json").status_code == 200
    Host.objects.exclude(name="sim-a").update(state="down")
    job = job_submit(user=world.member, spec=JobSpec(name="curves", kind="train", gpus=1, team="vision",
                                                     max_steps=STEPS, workload={"builtin": "mlp-digits"}))
    scheduler_pass()
    base = f"/api/v1/agent/jobs/{job.pk}"
    assert client.post(f"{base}/status/", {"state": "running", "attempt": 1}, format="json").json()["accepted"]
    start = time.time()
    records = [{"type": "progress", "step": s, "max_steps": STEPS, "loss": 2.0 / s, "steps_per_s": 4.0 + s % 3,
                "samples_per_s": 256.0, "ts": start + s / 10, **({"metrics": {"val_acc": s / 100}} if s % 10 == 0
                                                                  else {})}
               for s in range(1, STEPS + 1)]
    for batch in (records[:25], records[25:]):
        assert client.post(f"{base}/progress/", {"attempt": 1, "records": batch}, format="json").status_code == 200
    done = client.post(f"{base}/status/", {"state": "succeeded", "attempt": 1, "exit_code": 0}, format="json")
    assert done.json()["state"] == "succeeded"
    return job


def chart_points(page) -> dict[str, int]:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll("figure.metric-chart")]
        .map((f) => [f.dataset.metric, Number(f.dataset.points)]))""")


def test_after_a_reload_a_finished_jobs_curves_come_from_the_stored_metrics(world, page_for, artifacts):
    job = finished_job_with_reports(world)
    page = page_for(world.viewer)
    for visit in ("first", "reload"):
        if visit == "first":
            page.goto(f"/jobs/{job.pk}/")
        else:
            page.reload()
        page.wait_for_selector('figure[data-metric="val_acc"]')
        assert chart_points(page) == {"loss": STEPS, "steps_per_s": STEPS, "samples_per_s": STEPS, "val_acc": 6}
        assert page.locator("figure.metric-chart figcaption").all_inner_texts() == [
            "Loss", "Steps per second", "Samples per second", "val_acc"]
        assert page.evaluate(INK, "val_acc") > 100 and page.evaluate(INK, "loss") > 100
        assert page.locator("#metrics-empty").is_hidden()
        assert page.locator("#job-progress").inner_text() == f"100.0 % ({STEPS} of {STEPS} steps)"
        assert page.locator("#job-eta").inner_text() == "—"  # finished: nothing left
    page.screenshot(path=str(artifacts / "job-metrics.png"), full_page=True)

    page.get_by_role("link", name="Compare with other runs").click()
    page.wait_for_selector('figure[data-metric="loss"]')
    assert chart_points(page) == {"loss": STEPS} and page.evaluate(INK, "loss") > 100
    page.get_by_label("Metric", exact=True).select_option("val_acc")
    page.get_by_role("button", name="Compare").click()
    page.wait_for_selector('figure[data-metric="val_acc"]')
    assert chart_points(page) == {"val_acc": 6}
    assert page.locator("figure.metric-chart .legend-item").all_inner_texts() == [f"job {job.pk}: curves"]
    page.screenshot(path=str(artifacts / "job-compare.png"), full_page=True)
