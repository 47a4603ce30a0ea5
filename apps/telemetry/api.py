from __future__ import annotations

import django_filters
from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import access
from apps.accounts.api import IsSiteAdmin
from apps.cluster.authentication import AgentView
from apps.core.schema import ErrorSerializer
from apps.jobs.models import Job
from apps.telemetry import alerts, services, tickets
from apps.telemetry.models import Alert, AlertRule
from apps.telemetry.selectors import job_gpu_summary
from apps.telemetry.serializers import AlertRuleSerializer, AlertSerializer


class AlertFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=Alert.State.choices)
    team = django_filters.CharFilter(field_name="team__slug")
    host = django_filters.CharFilter(field_name="host__name")

    class Meta:
        model = Alert
        fields = ["state", "team", "host", "job"]


class AlertViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Alerts you may see: cluster-wide ones and those about your teams' jobs (admins: all)."""

    serializer_class = AlertSerializer
    filterset_class = AlertFilter

    def get_queryset(self):
        return access.restrict(Alert.objects.select_related("rule", "host", "gpu__host", "job", "team"),
                               self.request.user)

    @extend_schema(request=None, responses=AlertSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        alert = self.get_object()
        alerts.acknowledge(alert, request.user)  # 403 (AccessDenied) unless an admin or the team's manager
        return Response(AlertSerializer(self.get_queryset().get(pk=alert.pk)).data)

    @extend_schema(request=None, responses=AlertSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsSiteAdmin])
    def resolve(self, request: Request, pk: str | None = None) -> Response:
        alert = self.get_object()
        alerts.resolve_by_hand(alert, request.user)
        return Response(AlertSerializer(self.get_queryset().get(pk=alert.pk)).data)


class AlertRuleViewSet(viewsets.ModelViewSet):
    """Alert rules: thresholds, durations and actions (site admins)."""

    queryset = AlertRule.objects.prefetch_related("teams")
    serializer_class = AlertRuleSerializer
    permission_classes = [IsSiteAdmin]

    def perform_create(self, serializer) -> None:
        serializer.save()
        alerts.reload_rules()

    def perform_update(self, serializer) -> None:
        serializer.save()
        alerts.reload_rules()

    def perform_destroy(self, instance) -> None:
        instance.delete()
        alerts.reload_rules()


class WsTicketView(APIView):
    """A one-time ticket (valid 30 s) to open a websocket as `?ticket=…`: never put the API token in a URL."""

    @extend_schema(request=None, responses={201: OpenApiTypes.OBJECT, 503: ErrorSerializer})
    def post(self, request: Request) -> Response:
        ticket = tickets.issue(request.user)
        if ticket is None:
            return Response({"detail": "Live updates are unavailable right now (the cache is down); try again "
                                       "shortly."}, status=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "5"})
        return Response({"ticket": ticket, "expires_in": tickets.TICKET_TTL_S}, status=status.HTTP_201_CREATED)


class TelemetryIngestView(AgentView):
    """One batch of GPU samples (and XID events) from a host agent, about once a second."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        try:
            result = services.ingest_batch(request.auth, request.data)
        except services.TelemetryRejected as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(result)


class JobGpuSummarySerializer(serializers.Serializer):
    samples = serializers.IntegerField(help_text="GPU samples taken while the job held its GPUs")
    utilization_mean = serializers.FloatField(help_text="%")
    utilization_max = serializers.FloatField(help_text="%")
    memory_max_mb = serializers.IntegerField()
    energy_wh = serializers.FloatField(help_text="the integral of the GPUs' power over the job's samples")


class JobGpuSummaryView(APIView):
    """What a job's GPUs did over its lifetime: mean and peak utilization, peak memory, energy. Same access as the
    job (others get 404); 404 too before the first sample."""

    @extend_schema(responses={200: JobGpuSummarySerializer, 404: ErrorSerializer})
    def get(self, request: Request, pk: int) -> Response:
        job = get_object_or_404(access.restrict(Job.objects.all(), request.user), pk=pk)
        summary = job_gpu_summary(job.pk)
        if summary is None:
            raise Http404("No GPU samples recorded for this job yet.")
        return Response(summary)
