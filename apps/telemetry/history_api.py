"""The history API: the cluster's, a host's, a GPU's and a team's time series (apps/telemetry/series.py).

Query: `range` (1h, 24h, 7d, 30d) or `from`/`to` (UNIX seconds or ISO 8601), optional `resolution` (10 or 60).
Bad input answers 400 naming the field. What a user may see is apps/accounts/access.py's: hosts and GPUs for
anyone with a role in some team (others: 404), a team's allocation for its members, a queue only of visible teams.
"""

from __future__ import annotations

from django.db.models import Q
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import access
from apps.accounts.models import Team
from apps.cluster.models import GPU, Host
from apps.telemetry import series

WINDOW_PARAMS = [
    OpenApiParameter("range", str, enum=list(series.RANGES), description="The last hour, day, week or month."),
    OpenApiParameter("from", str, description="Start (UNIX seconds or ISO 8601), instead of range."),
    OpenApiParameter("to", str, description="End (default: now)."),
    OpenApiParameter("resolution", int, enum=list(series.RESOLUTIONS),
                     description="Bucket seconds (default: 10 within the last day, else 60)."),
]
SCHEMA = extend_schema(parameters=WINDOW_PARAMS, responses={200: OpenApiTypes.OBJECT})  # 400: the field errors (apps/core/schema.py)


def _hosts(request: Request):
    return access.restrict(Host.objects.all(), request.user)


class ClusterMetricsView(APIView):
    """Utilization, memory, temperature and power of the GPUs you may see; GPUs allocated, idle, stale and down;
    queue length and waits of your teams (admins: every team)."""

    @SCHEMA
    def get(self, request: Request) -> Response:
        window = series.parse_window(request.query_params)
        gpus = Q(gpu__host__in=_hosts(request))
        return Response(series.cluster_series(access.viewer(request.user), gpus, window))


class HostMetricsView(APIView):
    """One host's GPUs over time: mean and peak utilization, memory and power summed, the hottest temperature."""

    @SCHEMA
    def get(self, request: Request, name: str) -> Response:
        host = get_object_or_404(_hosts(request), name=name)
        window = series.parse_window(request.query_params)
        return Response({"host": host.name, **series.gpu_series(Q(gpu__host=host), window)})


class GpuMetricsView(APIView):
    """One GPU over time (by UUID)."""

    @SCHEMA
    def get(self, request: Request, uuid: str) -> Response:
        gpu = get_object_or_404(access.restrict(GPU.objects.select_related("host"), request.user), uuid=uuid)
        window = series.parse_window(request.query_params)
        return Response({"host": gpu.host.name, "index": gpu.index, "uuid": gpu.uuid,
                         **series.gpu_series(Q(gpu=gpu), window)})


class TeamAllocationView(APIView):
    """A team's GPUs held against its quota (guaranteed and borrowed apart), and its queue, over time."""

    @SCHEMA
    def get(self, request: Request, slug: str) -> Response:
        team = get_object_or_404(access.restrict(Team.objects.all(), request.user), slug=slug)
        window = series.parse_window(request.query_params)
        return Response(series.team_allocation(team.slug, window))
