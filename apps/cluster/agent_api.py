"""The agent's side of the API: registration, authenticated by the host's own token (heartbeats: apps.operations)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.cluster.authentication import AgentView
from apps.cluster.services import host_register
from apps.core.schema import ErrorSerializer
from workers.protocol import (
    CONTAINER_RUNTIMES,
    HEARTBEAT_INTERVAL_S,
    PROTOCOL_VERSION,
    JobIsolation,
    host_queue,
    valid_address,
)

__all__ = ["AgentView", "GpuRecordSerializer", "RegisterView", "RegistrationSerializer"]


class GpuRecordSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=255)
    uuid = serializers.CharField(max_length=80)
    name = serializers.CharField(max_length=120, allow_blank=True)
    gpu_type = serializers.CharField(max_length=60)
    memory_mb = serializers.IntegerField(min_value=0)


class RegistrationSerializer(serializers.Serializer):
    host = serializers.CharField(max_length=100)
    agent_version = serializers.CharField(max_length=40)
    protocol = serializers.IntegerField()
    simulated = serializers.BooleanField()
    driver_version = serializers.CharField(max_length=40, allow_blank=True, required=False, default="")
    cuda_version = serializers.CharField(max_length=40, allow_blank=True, required=False, default="")
    address = serializers.CharField(max_length=200, allow_blank=True, required=False, default="",
                                    trim_whitespace=False, help_text="IP address or host name (RFC 1123) the console and other hosts "
                                              "reach this one at; blank: the host's name")
    gpus = GpuRecordSerializer(many=True, max_length=64)
    runtime = serializers.ChoiceField(choices=CONTAINER_RUNTIMES, required=False, default="process",
                                      help_text="How the agent runs jobs: on the host, or in podman/docker containers")
    job_isolation = serializers.ChoiceField(
        choices=JobIsolation.MODES, required=False, allow_blank=True, default="",
        help_text="How the agent keeps process jobs apart (JobIsolation.user); blank: an agent that does not say")
    images = serializers.ListField(child=serializers.JSONField(), required=False, default=list, max_length=2000,
                                   help_text="The images in a container host's store (ImageRecord); malformed "
                                             "entries are dropped")

    def validate_address(self, value: str) -> str:
        if value and not valid_address(value):
            raise serializers.ValidationError("Expected an IP address or a host name (letters, digits, hyphens and "
                                              "dots), with no scheme, port, path, user or spaces.")
        return value


class RegisterView(AgentView):
    @extend_schema(request=RegistrationSerializer, responses={200: OpenApiTypes.OBJECT, 409: ErrorSerializer})
    def post(self, request: Request) -> Response:
        form = RegistrationSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        host = host_register(request.auth, form.validated_data)  # a registration that conflicts: 409
        return Response({"host": host.name, "queue": host_queue(host.name), "state": host.state,
                         "protocol": PROTOCOL_VERSION, "heartbeat_interval_s": HEARTBEAT_INTERVAL_S})
