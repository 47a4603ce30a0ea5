"""GET /api/v1/teams/<slug>/usage/: a team's usage, served beside the job records it is derived from."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.api import visible_team
from apps.jobs.usage import team_usage


class TeamUsageSerializer(serializers.Serializer):
    team = serializers.CharField()
    gpus_held = serializers.FloatField(help_text="fractions of shared GPUs counted exactly")
    max_gpus = serializers.IntegerField()
    gpu_hours_this_month = serializers.FloatField()
    gpu_hours_budget = serializers.FloatField(help_text="0 means unlimited")
    gpu_hours_left = serializers.FloatField(allow_null=True, help_text="null means unlimited")
    gpu_hours_over = serializers.FloatField(help_text="GPU-hours used beyond the budget (jobs that ran on)")
    budget_used_pct = serializers.FloatField(allow_null=True, help_text="null means unlimited; above 100 when over")
    budget_spent = serializers.BooleanField(help_text="no new job of the team starts this month")
    when_budget_spent = serializers.CharField(help_text="finish: running jobs finish; stop: they checkpoint and stop")
    period_start = serializers.DateTimeField()


class TeamUsageView(APIView):
    """GPUs the team holds now, GPU-hours used this month and the budget left."""

    @extend_schema(responses=TeamUsageSerializer)
    def get(self, request: Request, slug: str) -> Response:
        team = visible_team(request, slug)
        return Response(TeamUsageSerializer(team_usage(team)).data)
