"""The browser console. Who sees and does what: apps/accounts/access.py; every change goes through a service."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.accounts import access
from apps.accounts import services as account_services
from apps.accounts.access import Action
from apps.accounts.models import ApiToken, Membership, Role, Team
from apps.core.errors import DomainError, InvalidInput
from apps.dashboard import reports
from apps.dashboard.confirm import confirm_page, confirmed
from apps.dashboard.context import report_teams
from apps.dashboard.errors import forbidden, form_refusal
from apps.dashboard.forms import (
    CancelForm,
    DecisionForm,
    JobSubmitForm,
    MemberAddForm,
    PeriodForm,
    QuotaRequestForm,
    RoleForm,
    ServiceCreateForm,
    ServiceScaleForm,
    TokenCreateForm,
)
from apps.dashboard.job_metrics import job_metrics_context
from apps.dashboard.selectors import alerts_visible_to, cluster_overview
from apps.dashboard.services import alert_acknowledge
from apps.jobs import selectors as job_selectors
from apps.jobs import services as job_services
from apps.jobs.colocating import sharing_text
from apps.jobs.models import Job, JobAllocation
from apps.jobs.usage import team_usage
from apps.quotas.models import QuotaRequest
from apps.quotas.services import quota_ensure, quota_request_create, quota_request_decide
from apps.serving import services as serving_services
from apps.serving.models import InferenceService
from apps.telemetry.models import Alert, GpuSampleBucket
from workers.runtime.catalog import PRESETS, WORKLOADS

logger = logging.getLogger(__name__)
LOG_TAIL_CHARS = 64_000
CLUSTER_CHARTS = [("utilization", "Utilization (%)"), ("gpus", "GPUs allocated, idle, stale, down"),
                  ("queue", "Queued jobs"), ("waits", "Queue wait (min)"), ("memory", "Memory (GiB)"),
                  ("temperature", "Hottest GPU (°C)"), ("power", "Power (W)")]
TEAM_CHARTS = 8  # allocation charts on the overview, one per team (the first ones by slug)


def _teams(request: HttpRequest, action: Action = Action.VIEW) -> QuerySet[Team]:
    """The teams on which the user may do `action`."""
    return access.restrict(Team.objects.all(), request.user, action)


def _jobs(request: HttpRequest) -> QuerySet[Job]:
    return access.restrict(Job.objects.select_related("team", "user"), request.user)


def _services(request: HttpRequest) -> QuerySet[InferenceService]:
    live = InferenceService.objects.exclude(state=InferenceService.State.DELETED).select_related("team", "owner")
    return access.restrict(live, request.user)


# --- overview


@login_required
def home(request: HttpRequest) -> HttpResponse:
    overview = cluster_overview(request.user)
    teams = list(_teams(request))
    return render(request, "dashboard/home.html", {
        "overview": overview,
        "usages": [team_usage(team) for team in teams],
        "gpu_total": overview.busy + overview.idle + overview.stale + overview.down,
        "host_total": len(overview.hosts),
        "no_team": not teams,
        "history_api": reverse("metrics-cluster"), "charts": CLUSTER_CHARTS,
        "team_charts": [(team.slug, reverse("team-allocation", args=[team.slug])) for team in teams[:TEAM_CHARTS]],
    })


# --- jobs


# The jobs table, the queue and bulk cancel: apps/dashboard/jobs_table.py.


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    teams = list(_teams(request, Action.SUBMIT).values_list("slug", flat=True))
    if not teams:
        return forbidden(request, "You have no team role that may submit jobs (viewers cannot).")
    form = JobSubmitForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        try:
            job = job_services.job_submit(user=request.user, spec=form.spec(), request=request)
        except DomainError as exc:
            form_refusal(form, exc)
        else:
            messages.success(request, f"Job array {job.pk} submitted: {job.array_size} tasks." if job.array_size
                             else f"Job {job.pk} submitted.")
            return redirect("dashboard:job-detail", job_id=job.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "dashboard/job_new.html", {
        "form": form,
        "presets": [p.as_dict() for p in PRESETS.values()],
        "workloads": [w.as_dict() for w in WORKLOADS.values()],
    }, status=status)


def _visible_job(request: HttpRequest, job_id: int) -> Job:
    allocations = JobAllocation.objects.select_related("gpu__host").order_by("gpu__host__name", "gpu__index")
    return get_object_or_404(_jobs(request).prefetch_related(Prefetch("allocations", queryset=allocations)),
                             pk=job_id)


def _job_history(job: Job, gpus: list[Any]) -> dict[str, list[list[Any]]]:
    """Per GPU uuid: [[epoch s, util, memory MB, temperature, power W], ...] between placement and the end."""
    if not gpus or job.placed_at is None and job.started_at is None:
        return {}
    start = job.placed_at or job.started_at
    end = job.finished_at
    span = ((end or start + timedelta(hours=1)) - start).total_seconds()
    resolution = 60 if span > 2 * 3600 else 10
    rows = GpuSampleBucket.objects.filter(gpu__in=gpus, bucket_start__gte=start - timedelta(seconds=resolution),
                                          resolution_s=resolution)
    if end is not None:
        rows = rows.filter(bucket_start__lte=end)
    series: dict[str, list[list[Any]]] = {}
    for uuid, ts, util, mem, temp, power in rows.order_by("bucket_start").values_list(
        "gpu__uuid", "bucket_start", "utilization_avg", "memory_used_max_mb", "temperature_max", "power_avg_w"
    )[:20_000]:
        series.setdefault(uuid, []).append([round(ts.timestamp()), util, mem, temp, power])
    return series


# The page lists the first artifacts (in path order) and links the API's listing for the rest.
ARTIFACTS_SHOWN = 200


def _artifacts(job: Job) -> list[tuple[str, int]]:
    from workers.runtime.artifacts import artifact_store_from_url

    try:
        return artifact_store_from_url(settings.ARTIFACT_STORE_URL).list_page(str(job.pk), limit=ARTIFACTS_SHOWN + 1)
    except Exception:  # noqa: BLE001 - a broken store must not break the page
        logger.warning("could not list artifacts of job %s", job.pk, exc_info=True)
        return []


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _visible_job(request, job_id)
    active = job_selectors.attempt_allocations(job)
    start = max(job.log_size - LOG_TAIL_CHARS, 0)
    log_text, log_next = job_selectors.job_log_slice(job, start, LOG_TAIL_CHARS)
    gpus = [a.gpu for a in active]
    artifacts = _artifacts(job)
    believed = job_selectors.believed_max_steps(job)
    return render(request, "dashboard/job_detail.html", {
        "job": job,
        "believed": None if believed is None else {
            "steps": believed[0], "runs": believed[1],
            "than": "fewer" if believed[0] < (job.max_steps or 0) else "more"},
        "allocations": active,
        "events": list(job_selectors.job_events(job)),
        "log_text": log_text,
        "log_start": start,
        "log_next": log_next,
        "may_cancel": not job.is_final and access.can(request.user, Action.CANCEL, job),
        "history": _job_history(job, gpus),
        "artifacts": artifacts[:ARTIFACTS_SHOWN],
        "artifacts_more": len(artifacts) > ARTIFACTS_SHOWN,
        "preset": PRESETS.get(job.preset),
        "sharing": sharing_text(job),
        "live": {"job": job.pk, "log_next": log_next, "state": job.state, "final": job.is_final,
                 "gpus": [g.uuid for g in gpus], "max_steps": job.max_steps},
        **job_metrics_context(job),
    })


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _visible_job(request, job_id)
    form = CancelForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    if not confirmed(request) and not job.is_final:  # a final job: the service says it is over
        if not access.can(request.user, Action.CANCEL, job):
            return forbidden(request, access.MESSAGES[Action.CANCEL])
        return confirm_page(request, title=f"Cancel job {job.pk}?",
                            question=f"Job {job.pk} ({job.name}) stops now and cannot be resumed.",
                            button="Yes, cancel the job", back=reverse("dashboard:job-detail", args=[job.pk]),
                            keep={"reason": reason})
    job_services.job_cancel(job=job, actor=request.user, reason=reason, request=request)  # refusals: errors.py
    messages.success(request, f"Job {job.pk} cancelled.")
    return redirect("dashboard:job-detail", job_id=job.pk)


# --- inference services


def _service_teams(request: HttpRequest) -> list[str]:
    return list(_teams(request, Action.SUBMIT).order_by("slug").values_list("slug", flat=True))


@login_required
def service_list(request: HttpRequest) -> HttpResponse:
    teams = _service_teams(request)
    form = None
    status = 200
    if request.method == "POST":
        if not teams:
            return forbidden(request, "You have no team role that may create services (viewers cannot).")
        form = ServiceCreateForm(request.POST, teams=teams)
        if form.is_valid():
            team = _teams(request, Action.SUBMIT).get(slug=form.cleaned_data["team"])
            try:
                service = serving_services.service_create(
                    user=request.user, spec=serving_services.ServiceSpec(team=team, **form.spec_fields()))
            except DomainError as exc:
                form_refusal(form, exc)
            else:
                messages.success(request, f"Service {service} created with {service.desired_replicas} replica(s).")
                return redirect("dashboard:service-detail", service_id=service.pk)
        status = 400
    elif teams:
        form = ServiceCreateForm(teams=teams)
    services = list(_services(request).order_by("team__slug", "name"))
    rows = [(service, serving_services.service_stats(service)) for service in services]
    return render(request, "dashboard/service_list.html", {"rows": rows, "form": form}, status=status)


def _visible_service(request: HttpRequest, service_id: int) -> InferenceService:
    return get_object_or_404(_services(request), pk=service_id)


def _service_page(request: HttpRequest, service: InferenceService, scale_form: ServiceScaleForm | None = None,
                  status: int = 200) -> HttpResponse:
    may_manage = access.can(request.user, Action.MANAGE_SERVICE, service)
    ready = {r["job"] for r in serving_services.ready_replicas(service.pk)}
    replicas = [(replica, replica.job_id in ready)
                for replica in service.replicas.filter(retired=False).select_related("job").order_by("pk")]
    events = list(service.events.order_by("-id")[:200])[::-1]
    endpoint = f"/serve/{service.team.slug}/{service.name}/predict"
    if may_manage and scale_form is None:
        scale_form = ServiceScaleForm(initial={
            "min_replicas": service.min_replicas, "max_replicas": service.max_replicas,
            "target_p95_ms": service.target_p95_ms, "target_rps_per_replica": service.target_rps_per_replica})
    return render(request, "dashboard/service_detail.html", {
        "service": service,
        "stats": serving_services.service_stats(service),
        "replicas": replicas,
        "events": events,
        "endpoint": endpoint,
        "endpoint_url": request.build_absolute_uri(endpoint),
        "may_manage": may_manage,
        "scale_form": scale_form if may_manage else None,
        "live": {"service": service.pk, "last_event": events[-1].pk if events else 0},
    }, status=status)


@login_required
def service_detail(request: HttpRequest, service_id: int) -> HttpResponse:
    return _service_page(request, _visible_service(request, service_id))


@login_required
@require_POST
def service_scale(request: HttpRequest, service_id: int) -> HttpResponse:
    service = _visible_service(request, service_id)
    if not access.can(request.user, Action.MANAGE_SERVICE, service):  # before reading the form: 403, not 400
        return forbidden(request, access.MESSAGES[Action.MANAGE_SERVICE])
    form = ServiceScaleForm(request.POST)
    if form.is_valid():
        try:
            service = serving_services.service_scale(service=service, user=request.user,
                                                     changes=dict(form.cleaned_data))
        except InvalidInput as exc:  # not allowed: a 403 (errors.py)
            form_refusal(form, exc)
        else:
            messages.success(request, f"Service {service} now scales between {service.min_replicas} and "
                                      f"{service.max_replicas} replicas.")
            return redirect("dashboard:service-detail", service_id=service.pk)
    return _service_page(request, service, scale_form=form, status=400)


@login_required
@require_POST
def service_delete(request: HttpRequest, service_id: int) -> HttpResponse:
    service = _visible_service(request, service_id)
    serving_services.service_delete(service=service, user=request.user)
    messages.success(request, f"Service {service} deleted; its replicas are stopping.")
    return redirect("dashboard:services")


# --- teams and quotas


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    teams = list(_teams(request).select_related("quota"))
    pending = QuotaRequest.objects.filter(state=QuotaRequest.State.PENDING).select_related("team")
    return render(request, "dashboard/team_list.html", {
        "rows": [(team, team_usage(team)) for team in teams],
        "pending": access.restrict(pending, request.user, Action.DECIDE_QUOTA),
    })


def _team_page(request: HttpRequest, slug: str, **forms: Any) -> HttpResponse:
    team = get_object_or_404(_teams(request), slug=slug)
    is_manager = access.can(request.user, Action.MANAGE_MEMBERS, team)
    usage = team_usage(team)
    budget_pct = None
    if usage.gpu_hours_budget:
        budget_pct = min(100.0, usage.budget_used_pct or 0.0)
    context = {
        "team": team,
        "quota": quota_ensure(team),
        "usage": usage,
        "budget_pct": budget_pct,
        "held_pct": min(100.0, 100.0 * usage.gpus_held / usage.max_gpus) if usage.max_gpus else None,
        "memberships": access.restrict(Membership.objects.filter(team=team), request.user)
        .select_related("user").order_by("user__username"),
        "is_manager": is_manager,
        "may_decide": access.can(request.user, Action.DECIDE_QUOTA, team),
        "roles": Role.choices,
        "requests": QuotaRequest.objects.filter(team=team).select_related("requested_by", "decided_by")[:20],
        "member_form": forms.get("member_form") or MemberAddForm(),
        "request_form": forms.get("request_form") or QuotaRequestForm(),
    }
    return render(request, "dashboard/team_detail.html", context, status=400 if forms else 200)


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    return _team_page(request, slug)


def _managed_team(request: HttpRequest, slug: str, action: Action = Action.MANAGE_MEMBERS):
    """The team (404 if unseen), or the refusal (403) when the user may not do `action` to it."""
    team = get_object_or_404(_teams(request), slug=slug)
    if not access.can(request.user, action, team):
        return team, forbidden(request, access.MESSAGES[action])
    return team, None


@login_required
@require_POST
def team_member_add(request: HttpRequest, slug: str) -> HttpResponse:
    team, refused = _managed_team(request, slug)
    if refused:
        return refused
    form = MemberAddForm(request.POST)
    if not form.is_valid():
        return _team_page(request, slug, member_form=form)
    account_services.membership_set(team=team, user=form.cleaned_data["username"], role=Role(form.cleaned_data["role"]),
                                    actor=request.user, request=request)
    messages.success(request, f"{form.cleaned_data['username'].username} is now {form.cleaned_data['role']} of {slug}.")
    return redirect("dashboard:team-detail", slug=slug)


def _managed_membership(request: HttpRequest, slug: str, username: str):
    """The team a manager acts on, one of its memberships (404 if unseen), or the refusal to answer."""
    team, refused = _managed_team(request, slug)
    if refused:
        return team, None, refused
    membership = get_object_or_404(access.restrict(Membership.objects.filter(team=team), request.user)
                                   .select_related("user"), user__username=username)
    return team, membership, None


@login_required
@require_POST
def team_member_role(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    team, membership, refused = _managed_membership(request, slug, username)
    if refused:
        return refused
    form = RoleForm(request.POST)
    if form.is_valid():
        account_services.membership_set(team=team, user=membership.user, role=Role(form.cleaned_data["role"]),
                                        actor=request.user, request=request)
        messages.success(request, f"{username} is now {form.cleaned_data['role']} of {slug}.")
    else:
        messages.error(request, "Choose a valid role.")
    return redirect("dashboard:team-detail", slug=slug)


@login_required
@require_POST
def team_member_remove(request: HttpRequest, slug: str, username: str) -> HttpResponse:
    _, membership, refused = _managed_membership(request, slug, username)
    if refused:
        return refused
    if not confirmed(request):
        return confirm_page(request, title=f"Remove {username} from {slug}?",
                            question=f"{username} loses their role in {slug} and its jobs, services and secrets.",
                            button=f"Yes, remove {username}", back=reverse("dashboard:team-detail", args=[slug]))
    account_services.membership_remove(membership=membership, actor=request.user, request=request)
    messages.success(request, f"{username} removed from {slug}.")
    return redirect("dashboard:team-detail", slug=slug)


@login_required
@require_POST
def quota_request_new(request: HttpRequest, slug: str) -> HttpResponse:
    team, refused = _managed_team(request, slug, Action.REQUEST_QUOTA)
    if refused:
        return refused
    form = QuotaRequestForm(request.POST)
    if not form.is_valid():
        return _team_page(request, slug, request_form=form)
    try:
        quota_request_create(team=team, requested_by=request.user, reason=form.cleaned_data["reason"],
                             max_gpus=form.cleaned_data.get("max_gpus"),
                             gpu_hours_per_month=form.cleaned_data.get("gpu_hours_per_month"), request=request)
    except DomainError as exc:
        form_refusal(form, exc)
        return _team_page(request, slug, request_form=form)
    messages.success(request, "Quota request sent to the site admins.")
    return redirect("dashboard:team-detail", slug=slug)


@login_required
@require_POST
def quota_request_decision(request: HttpRequest, slug: str, request_id: int) -> HttpResponse:
    team = get_object_or_404(_teams(request), slug=slug)
    quota_request = get_object_or_404(QuotaRequest, pk=request_id, team=team)
    if not access.can(request.user, Action.DECIDE_QUOTA, quota_request):
        return forbidden(request, access.MESSAGES[Action.DECIDE_QUOTA])
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose approve or reject.")
        return redirect("dashboard:team-detail", slug=slug)
    quota_request_decide(quota_request=quota_request, approve=form.cleaned_data["decision"] == "approve",
                         actor=request.user, note=form.cleaned_data["note"], request=request)  # refusals: errors.py
    messages.success(request, f"Quota request {request_id} {form.cleaned_data['decision']}d.")
    return redirect("dashboard:team-detail", slug=slug)


# --- reports


@login_required
def usage_report(request: HttpRequest) -> HttpResponse:
    """Admins see every team; managers the teams they manage; anyone else gets 404 (per-user usage is theirs)."""
    teams = list(report_teams(request.user))
    if not teams:
        raise Http404("No report for you.")
    form = PeriodForm(request.GET if request.GET.get("start") or request.GET.get("end") else None)
    start, end = form.period()
    if not form.is_bound:  # show the default period in the date fields
        form = PeriodForm(initial={"start": start.date(), "end": end.date()})
    report = reports.usage_report(teams, start, end)
    if request.GET.get("format") == "csv":
        response = HttpResponse(reports.report_csv(report), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="usage-{start:%Y%m%d}-{end:%Y%m%d}.csv"'
        return response
    chart = {
        "labels": [r.team for r in report.teams],
        "used": [round(r.used, 3) for r in report.teams],
        "idle": [round(r.idle, 3) for r in report.teams],
        "unknown": [round(r.unknown, 3) for r in report.teams],
    }
    query = request.GET.copy()
    query["format"] = "csv"
    return render(request, "dashboard/report_usage.html", {
        "form": form, "report": report, "chart": chart, "csv_query": query.urlencode(),
        "top_waste": report.top_waste(), "has_costs": bool(report.costs),
    })


# --- alerts


@login_required
def alert_list(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    alerts = alerts_visible_to(request.user)
    if state in Alert.State.values:
        alerts = alerts.filter(state=state)
    shown = list(alerts[:300])
    ackable = set(alerts_visible_to(request.user, Action.ACK_ALERT).filter(
        pk__in=[alert.pk for alert in shown], state=Alert.State.FIRING).values_list("pk", flat=True))
    rows = [(alert, alert.pk in ackable) for alert in shown]
    return render(request, "dashboard/alerts.html", {"rows": rows, "state": state, "states": Alert.State.values})


@login_required
@require_POST
def alert_ack(request: HttpRequest, alert_id: int) -> HttpResponse:
    alert = get_object_or_404(alerts_visible_to(request.user), pk=alert_id)
    changed = alert_acknowledge(alert=alert, actor=request.user)  # not allowed: a 403 (errors.py)
    if changed:
        messages.success(request, f"Alert {alert.pk} acknowledged.")
    else:
        messages.info(request, f"Alert {alert.pk} was no longer firing.")
    return redirect(reverse("dashboard:alerts") + (f"?state={request.POST['state']}"
                                                   if request.POST.get("state") in Alert.State.values else ""))


# --- account


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    form = TokenCreateForm(request.POST or None)
    secret = None
    status = 200
    if request.method == "POST":
        if form.is_valid():
            token, secret = account_services.token_create(
                user=request.user, name=form.cleaned_data["name"],
                expires_in_days=form.cleaned_data.get("expires_in_days"), request=request,
            )
            form = TokenCreateForm()
        else:
            status = 400
    response = render(request, "dashboard/tokens.html", {
        "form": form, "secret": secret, "tokens": access.restrict(ApiToken.objects.all(), request.user),
    }, status=status)
    if secret:
        response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(access.restrict(ApiToken.objects.all(), request.user), pk=token_id)
    account_services.token_revoke(token=token, actor=request.user, request=request)
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("dashboard:tokens")
