"""The job page's kept metrics and GPU summary, and the page that compares runs on one chart."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from apps.accounts import access
from apps.jobs.metrics import job_metrics, job_progress
from apps.jobs.models import Job, JobMetricSeries
from apps.telemetry.selectors import job_gpu_summary
from workers.protocol import METRIC_NAME

# The most runs one chart compares.
MAX_COMPARED = 8


def job_metrics_context(job: Job) -> dict[str, Any]:
    """What the job page shows of the job's metrics: the stored series (embedded, the page draws them on load),
    progress percent and ETA, the GPU summary."""
    return {"metrics": {"max_points": settings.JOBS_METRIC_POINTS, "series": job_metrics(job)},
            "progress": job_progress(job), "gpu_summary": job_gpu_summary(job.pk)}


def _ids(raw: str) -> list[int] | None:
    try:
        ids = [int(part) for part in raw.replace(" ", ",").split(",") if part]
    except ValueError:
        return None
    unique = list(dict.fromkeys(ids))
    return unique if 1 <= len(unique) <= MAX_COMPARED and all(i > 0 for i in unique) else None


@login_required
def job_compare(request: HttpRequest) -> HttpResponse:
    """/jobs/compare/?ids=1,2&metric=loss: one metric of several runs on one chart. A run the user may not see
    answers 404, as its own page does."""
    raw = request.GET.get("ids", "")
    ids = _ids(raw)
    metric = request.GET.get("metric", "loss")
    errors = {}
    if ids is None:
        errors["ids"] = f"Name 1 to {MAX_COMPARED} job ids, separated by commas."
    if not METRIC_NAME.fullmatch(metric):
        errors["metric"] = "A metric name is a short identifier (letters, digits, _ . / -)."
    if errors:
        return render(request, "dashboard/job_compare.html", {"errors": errors, "ids": raw, "metric": metric,
                                                              "names": [], "jobs": [], "runs": []}, status=400)
    assert ids is not None
    jobs = {job.pk: job for job in access.restrict(Job.objects.select_related("team", "user"), request.user)
            .filter(pk__in=ids)}
    if len(jobs) != len(ids):
        raise Http404("No such job.")
    ordered = [jobs[i] for i in ids]
    names = sorted(set(JobMetricSeries.objects.filter(job__in=ordered).values_list("name", flat=True)))
    runs = [{"job": job.pk, "label": f"job {job.pk}: {job.name}",
             "series": next(iter(job_metrics(job, [metric])), None)} for job in ordered]
    return render(request, "dashboard/job_compare.html", {
        "errors": {}, "ids": ",".join(map(str, ids)), "metric": metric, "names": names, "jobs": ordered,
        "runs": runs, "compare": {"metric": metric, "max_points": settings.JOBS_METRIC_POINTS, "runs": runs}})
