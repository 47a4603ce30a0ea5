from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.accounts.selectors import teams_visible_to
from apps.cluster.selectors import hosts_visible_to
from apps.jobs.selectors import jobs_visible_to
from apps.quotas.selectors import team_usage


@login_required
def home(request: HttpRequest) -> HttpResponse:
    teams = list(teams_visible_to(request.user))
    context = {
        "usages": [team_usage(team) for team in teams],
        "jobs": jobs_visible_to(request.user)[:20],
        "hosts": hosts_visible_to(request.user),
    }
    return render(request, "dashboard/home.html", context)
