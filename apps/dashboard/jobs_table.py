"""The jobs table (/jobs/), the cluster-wide queue (/jobs/pending/) and bulk cancel (/jobs/cancel/).

The table sorts, searches and filters on the server (apps/jobs/table.py, the same parameters as GET /api/v1/jobs/)
and shows each job's placement, duration, live utilization (its GPUs' latest frames, as /ws/cluster/ sends them),
progress and ETA. The page follows /ws/cluster/ (static/js/jobs_table.js): GPU frames update utilization at once,
job state events ask for fresh rows; rows are also fetched every few seconds (`?fragment=rows`, answered 304 when
unchanged), which is all a browser without a live socket gets. Who sees and cancels what: apps/accounts/access.py.
"""

from __future__ import annotations

import hashlib
import json
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Page, Paginator
from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotModified
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts.access import Action
from apps.accounts.models import Team
from apps.dashboard.confirm import confirm_page, confirmed
from apps.dashboard.forms import JobFilterForm
from apps.jobs import bulk, table
from apps.jobs import selectors as job_selectors
from apps.jobs.metrics import job_progress
from apps.jobs.models import Job, JobAllocation
from apps.telemetry.freshness import host_status
from apps.telemetry.services import latest_frames

JOBS_PER_PAGE = 50
PENDING_SHOWN = 500  # the queue page lists at most this many waiting jobs
FRAGMENT = "fragment"  # ?fragment=rows: only the table's rows (and pager), for the page's script


class JobTableForm(JobFilterForm):
    """The jobs page's filters: those of JobFilterForm, a name search, "only mine" and the sort."""

    name = forms.CharField(required=False, max_length=200, label="Name contains")
    mine = forms.BooleanField(required=False, label="Only my jobs")
    ordering = forms.ChoiceField(choices=[("", "newest first"), *table.ordering_choices()], required=False,
                                 label="Sort by")
    array = forms.IntegerField(required=False, min_value=1, label="Tasks of job array")


@dataclass
class JobRow:
    job: Job
    placement: str = ""  # "node-a:0,1 node-b:3": the GPUs it holds (an ended job: its last attempt's)
    gpu_uuids: list[str] = field(default_factory=list)  # the GPUs it holds now (live utilization follows them)
    utilization: float | None = None  # the mean of its GPUs' latest live readings
    duration_s: float | None = None
    running_since: float | None = None  # epoch seconds: the page's script keeps a running job's duration ticking
    progress: dict[str, Any] = field(default_factory=dict)
    may_cancel: bool = False


def _visible_jobs(request: HttpRequest) -> QuerySet[Job]:
    return access.restrict(Job.objects.select_related("team", "user"), request.user)


def _placement(allocations: list[JobAllocation]) -> str:
    by_host: dict[str, list[str]] = {}
    for allocation in allocations:
        share = "" if allocation.share_units >= 100 else f"({allocation.share_units} %)"
        by_host.setdefault(allocation.gpu.host.name, []).append(f"{allocation.gpu.index}{share}")
    return " ".join(f"{host}:{','.join(indexes)}" for host, indexes in by_host.items())


def _live_utilization(held: dict[int, list[JobAllocation]]) -> dict[int, float | None]:
    """Each job's mean utilization over its GPUs' latest frames; None when no GPU of it has a live reading (its
    host stale or down: apps/telemetry/freshness.py)."""
    hosts = {a.gpu.host.name: a.gpu.host for allocations in held.values() for a in allocations}
    if not hosts:
        return {}
    frames = latest_frames(list(hosts))
    now = time.time()
    readings: dict[str, float] = {}
    for name, host in hosts.items():
        frame = frames.get(name)
        if frame is None or host_status(host.state, host.last_heartbeat, frame, now) not in ("up", "draining"):
            continue
        for entry in frame.get("gpus", []):
            if entry.get("utilization_pct") is not None:
                readings[entry["uuid"]] = float(entry["utilization_pct"])
    result: dict[int, float | None] = {}
    for job_id, allocations in held.items():
        values = [readings[a.gpu.uuid] for a in allocations if a.gpu.uuid in readings]
        result[job_id] = sum(values) / len(values) if values else None
    return result


def job_rows(request: HttpRequest, jobs: list[Job], now: datetime | None = None) -> list[JobRow]:
    """The table's rows for `jobs` (their allocations prefetched with their GPUs and hosts)."""
    now = now or timezone.now()
    cancellable = set(access.restrict(Job.objects.filter(pk__in=[j.pk for j in jobs if not j.is_final]),
                                      request.user, Action.CANCEL).values_list("pk", flat=True))
    rows = []
    held: dict[int, list[JobAllocation]] = {}
    for job in jobs:
        shown = job_selectors.attempt_allocations(job)
        row = JobRow(job=job, placement=_placement(shown), progress=job_progress(job), may_cancel=job.pk in cancellable)
        if job.state in Job.HOLDING_STATES:
            held[job.pk] = [a for a in shown if a.released_at is None]
            row.gpu_uuids = [a.gpu.uuid for a in held[job.pk]]
        if job.started_at is not None:
            if job.state == Job.State.RUNNING:
                row.duration_s = max(0.0, (now - job.started_at).total_seconds())
                row.running_since = job.started_at.timestamp()
            elif job.is_final and job.finished_at is not None:
                row.duration_s = max(0.0, (job.finished_at - job.started_at).total_seconds())
        rows.append(row)
    utilization = _live_utilization(held)
    for row in rows:
        row.utilization = utilization.get(row.job.pk)
    return rows


def _with_allocations(jobs: QuerySet[Job]) -> QuerySet[Job]:
    allocations = JobAllocation.objects.select_related("gpu__host").order_by("gpu__host__name", "gpu__index")
    return jobs.prefetch_related(Prefetch("allocations", queryset=allocations))


def _query_without(request: HttpRequest, *names: str) -> str:
    query = request.GET.copy()
    for name in names:
        query.pop(name, None)
    return query.urlencode()


def _fragment(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    """The rows (and pager) as JSON for the page's script; 304 when they are what it already has."""
    body = json.dumps({
        "rows": render_to_string(template, context, request=request),
        "pager": render_to_string("dashboard/_jobs_pager.html", context, request=request)
        if "page" in context else "",
        "summary": context.get("summary", ""),
    })
    etag = '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'
    if request.headers.get("If-None-Match") == etag:
        response: HttpResponse = HttpResponseNotModified()
    else:
        response = HttpResponse(body, content_type="application/json")
    response["ETag"] = etag
    response["Cache-Control"] = "no-cache, private"
    return response


def _sort_links(request: HttpRequest, current: str) -> dict[str, dict[str, str]]:
    """Per column key: the link that sorts by it (again: the other way) and its aria-sort."""
    links = {}
    for key in table.ORDERINGS:
        ascending_first = key in ("name", "state")
        if current == key:
            target, sort = f"-{key}", "ascending"
        elif current == f"-{key}":
            target, sort = key, "descending"
        else:
            target, sort = (key if ascending_first else f"-{key}"), "none"
        query = request.GET.copy()
        for name in ("page", FRAGMENT):
            query.pop(name, None)
        query["ordering"] = target
        links[key] = {"href": "?" + query.urlencode(), "sort": sort}
    return links


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    teams = list(access.restrict(Team.objects.all(), request.user).values_list("slug", flat=True))
    form = JobTableForm(request.GET or None, teams=teams)
    form.is_valid()  # a field that does not validate (another team's slug) filters nothing; the others apply
    data = getattr(form, "cleaned_data", {})
    jobs = table.filter_jobs(_visible_jobs(request), name=data.get("name", ""), states=[data.get("state", "")],
                             team=data.get("team", ""), user=data.get("user", ""), kind=data.get("kind", ""),
                             mine=request.user if data.get("mine") else None, array=data.get("array"))
    ordering = data.get("ordering") or table.DEFAULT_ORDERING
    now = timezone.now()
    page: Page = Paginator(_with_allocations(table.order_jobs(jobs, ordering, now)), JOBS_PER_PAGE).get_page(
        request.GET.get("page"))
    rows = job_rows(request, list(page.object_list), now)
    context = {
        "form": form, "page": page, "rows": rows, "query": _query_without(request, "page", FRAGMENT),
        "ordering": ordering, "sort": _sort_links(request, ordering),
        "may_submit": access.restrict(Team.objects.all(), request.user, Action.SUBMIT).exists(),
        "may_cancel_any": any(row.may_cancel for row in rows),
        "next": request.get_full_path(),
        "summary": f"{page.paginator.count} job{'s' if page.paginator.count != 1 else ''}",
    }
    if request.GET.get(FRAGMENT) == "rows":
        return _fragment(request, "dashboard/_job_rows.html", context)
    return render(request, "dashboard/job_list.html", context)


# --- the cluster-wide queue


@dataclass
class PendingRow:
    job: Job
    hidden_before: int = 0  # waiting jobs the user may not see, between the previous row and this one


def pending_rows(request: HttpRequest) -> tuple[list[PendingRow], int, int]:
    """Every waiting job the user may see, in queue order; how many there are; and how many waiting jobs the user
    may not see are ahead of them.

    Only those ahead are counted: the positions the scheduler gives (shown on each job's page) already say how
    many jobs wait before a job, while the number behind is another team's queue, which the live stream and the
    history keep to that team (access.visible_queue)."""
    waiting = table.waiting_in_queue_order(_visible_jobs(request))
    total = waiting.count()
    jobs = list(waiting[:PENDING_SHOWN])
    hidden = sorted(table.waiting_positions(excluding=waiting.values_list("pk", flat=True))) if jobs else []
    rows = []
    previous = 0
    for job in jobs:
        row = PendingRow(job=job)
        if job.queue_position is not None and hidden:
            # hidden positions in (previous, position)
            row.hidden_before = bisect_left(hidden, job.queue_position) - bisect_left(hidden, previous + 1)
            previous = job.queue_position
        rows.append(row)
    return rows, total, sum(row.hidden_before for row in rows)


@login_required
def job_pending(request: HttpRequest) -> HttpResponse:
    rows, total, hidden = pending_rows(request)
    context = {
        "rows": rows, "total": total, "hidden": hidden, "shown_limit": PENDING_SHOWN,
        "no_team": not access.restrict(Team.objects.all(), request.user).exists(),
        "summary": f"{total} waiting job{'s' if total != 1 else ''} you may see"
                   + (f"; {hidden} of other teams ahead of them, not shown" if hidden else ""),
    }
    if request.GET.get(FRAGMENT) == "rows":
        return _fragment(request, "dashboard/_pending_rows.html", context)
    return render(request, "dashboard/job_pending.html", context)


# --- bulk cancel


def _posted_ids(request: HttpRequest) -> tuple[list[int], bool]:
    """The job ids of the post (checkboxes `ids`, or one comma-separated `ids` from the confirm step); and whether
    any value was not an id."""
    ids: list[int] = []
    bad = False
    for value in request.POST.getlist("ids"):
        for part in value.split(","):
            part = part.strip()
            if part.isdigit() and int(part) > 0:
                ids.append(int(part))
            elif part:
                bad = True
    return list(dict.fromkeys(ids)), bad


def _back(request: HttpRequest) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                  require_https=request.is_secure()):
        return target
    return reverse("dashboard:jobs")


@login_required
@require_POST
def job_bulk_cancel(request: HttpRequest) -> HttpResponse:
    ids, bad = _posted_ids(request)
    back = _back(request)
    reason = request.POST.get("reason", "")[:300]
    if bad or not ids or len(ids) > bulk.MAX_BULK_CANCEL:
        messages.error(request, "Select the jobs to cancel first." if not ids and not bad else
                       f"Select at most {bulk.MAX_BULK_CANCEL} jobs (by their checkboxes).")
        return redirect(back)
    if not confirmed(request):
        visible = _visible_jobs(request).filter(pk__in=ids).in_bulk()
        cancellable = set(access.restrict(Job.objects.filter(pk__in=list(visible)), request.user, Action.CANCEL)
                          .values_list("pk", flat=True))
        items, refusals, go = [], [], []
        for job_id in ids:
            job = visible.get(job_id)
            if job is None:
                refusals.append(f"{job_id}: {bulk.NOT_FOUND}")
            elif job.is_final:
                refusals.append(f"{job.pk} ({job.name}): already {job.state}")
            elif job.pk not in cancellable:
                refusals.append(f"{job.pk} ({job.name}): {access.MESSAGES[Action.CANCEL]}")
            else:
                go.append(job.pk)
                items.append(f"{job.pk} ({job.name}, {job.team.slug}, {job.user.get_username()}, {job.state})")
        if not go:
            messages.error(request, "None of the selected jobs can be cancelled: " + "; ".join(refusals))
            return redirect(back)
        count = f"{len(go)} job{'s' if len(go) != 1 else ''}"
        return confirm_page(
            request, title=f"Cancel {count}?",
            question=f"These {count} stop now and cannot be resumed"
                     + (f"; {len(refusals)} selected will be left as they are ({'; '.join(refusals)})."
                        if refusals else "."),
            button=f"Yes, cancel {count}", back=back, items=items,
            keep={"ids": ",".join(str(i) for i in go), "reason": reason, "next": back})
    outcomes = bulk.jobs_cancel(ids=ids, actor=request.user, reason=reason, request=request)
    done = [o for o in outcomes if o.cancelled]
    refused = [o for o in outcomes if not o.cancelled]
    if done:
        messages.success(request, f"Cancelled {len(done)} job{'s' if len(done) != 1 else ''}: "
                                  + ", ".join(str(o.id) for o in done) + ".")
    if refused:
        messages.error(request, "Not cancelled: " + "; ".join(f"{o.id}: {o.detail}" for o in refused))
    return redirect(back)
