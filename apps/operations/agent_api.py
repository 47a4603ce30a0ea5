"""POST /api/v1/agent/heartbeat/: an agent's heartbeat, which touches the host (cluster), the jobs it should stop
or no longer runs (jobs) and the host's alerts (telemetry)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.cluster.authentication import AgentView
from apps.jobs.selectors import jobs_to_stop_on_host
from apps.operations.liveness import host_heartbeat_received


class HeartbeatSerializer(serializers.Serializer):
    running = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(min_value=0), min_length=2, max_length=2),
        required=False, default=list, max_length=1024, help_text="[job id, attempt] pairs the agent runs",
    )


class HeartbeatView(AgentView):
    @extend_schema(request=HeartbeatSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        form = HeartbeatSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        host = request.auth
        running = [(job_id, attempt) for job_id, attempt in form.validated_data["running"]]
        came_back = host_heartbeat_received(host, running)
        return Response({"stop": jobs_to_stop_on_host(host, running), "came_back": came_back})
