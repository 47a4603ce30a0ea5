from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import access
from apps.accounts.models import Team
from apps.core.serializers import RejectUnknownFieldsMixin
from apps.serving import services
from apps.serving.models import InferenceService, ServiceEvent


class ServiceSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    stats = serializers.SerializerMethodField()
    replicas = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()

    class Meta:
        model = InferenceService
        fields = ["id", "team", "name", "owner", "workload", "image", "command", "env", "secrets", "checkpoint",
                  "preset", "gpus_per_replica",
                  "min_replicas", "max_replicas", "target_p95_ms", "target_rps_per_replica", "max_batch",
                  "max_wait_ms", "batching", "desired_replicas", "state", "created_at", "endpoint", "stats",
                  "replicas"]
        read_only_fields = fields

    def get_stats(self, service: InferenceService) -> dict:
        return services.service_stats(service)

    def get_replicas(self, service: InferenceService) -> list[dict]:
        ready = {r["job"] for r in services.ready_replicas(service.pk)}
        return [{"job": r.job_id, "state": r.job.state, "ready": r.job_id in ready}
                for r in service.replicas.filter(retired=False).select_related("job")]

    def get_endpoint(self, service: InferenceService) -> str:
        return f"/serve/{service.team.slug}/{service.name}/predict"


class ServiceCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = serializers.SlugField(max_length=49)
    name = serializers.SlugField(max_length=49)
    workload = serializers.CharField(max_length=60, required=False, allow_blank=True, default="",
                                     help_text="a built-in workload whose model is served; or give image and command")
    image = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, default="",
                                  help_text="an OCI image whose server the service runs (with command)")
    command = serializers.JSONField(required=False, help_text="argv of the server in the image; it answers the HTTP "
                                                              "contract of docs/containers.md")
    env = serializers.JSONField(required=False, help_text='plain variables of an image service: {"NAME": "value"}')
    secrets = serializers.JSONField(required=False, help_text="names of the team's secrets to hand an image service")
    checkpoint = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
    preset = serializers.CharField(max_length=60, default="infer-fp32")
    gpus_per_replica = serializers.IntegerField(min_value=1, max_value=8, default=1)
    min_replicas = serializers.IntegerField(min_value=0, max_value=64, default=1)
    max_replicas = serializers.IntegerField(min_value=1, max_value=64, default=1)
    target_p95_ms = serializers.FloatField(min_value=1, max_value=600_000, required=False, allow_null=True)
    target_rps_per_replica = serializers.FloatField(min_value=0.01, max_value=1e6, required=False, allow_null=True)
    max_batch = serializers.IntegerField(min_value=1, max_value=1024, default=32)
    max_wait_ms = serializers.FloatField(min_value=0, max_value=1000, default=5.0)
    batching = serializers.BooleanField(default=True)


class ServiceScaleSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    min_replicas = serializers.IntegerField(min_value=0, max_value=64, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=64, required=False)
    target_p95_ms = serializers.FloatField(min_value=1, max_value=600_000, required=False, allow_null=True)
    target_rps_per_replica = serializers.FloatField(min_value=0.01, max_value=1e6, required=False, allow_null=True)


class ServiceEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ServiceEvent
        fields = ["id", "created_at", "kind", "reason", "data"]
        read_only_fields = fields


class ServiceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Inference services of your teams: create, scale (PATCH), delete; `/predict` goes through the gateway."""

    serializer_class = ServiceSerializer
    filterset_fields = ["state"]

    def get_queryset(self):
        live = InferenceService.objects.exclude(state=InferenceService.State.DELETED).select_related("team", "owner")
        return access.restrict(live, self.request.user)

    @extend_schema(request=ServiceCreateSerializer, responses={201: ServiceSerializer})
    def create(self, request: Request) -> Response:
        form = ServiceCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = dict(form.validated_data)
        team = access.restrict(Team.objects.all(), request.user).filter(slug=data.pop("team")).first()
        if team is None:
            raise serializers.ValidationError({"team": ["You are not a member of that team."]})
        service = services.service_create(user=request.user, spec=services.ServiceSpec(team=team, **data))
        return Response(ServiceSerializer(service).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ServiceScaleSerializer, responses=ServiceSerializer)
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        service = self.get_object()
        form = ServiceScaleSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        service = services.service_scale(service=service, user=request.user, changes=dict(form.validated_data))
        return Response(ServiceSerializer(service).data)

    def destroy(self, request: Request, pk: str | None = None) -> Response:
        service = self.get_object()
        services.service_delete(service=service, user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=ServiceEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        page = self.paginate_queryset(self.get_object().events.all())
        return self.get_paginated_response(ServiceEventSerializer(page, many=True).data)
