"""What agents report about the jobs they run: status, log output and progress."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.cluster.authentication import AgentView
from apps.core.schema import ErrorSerializer
from apps.jobs import services
from workers.protocol import MAX_PROGRESS_BATCH, JobStatus


class StatusSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=JobStatus.STATES)
    attempt = serializers.IntegerField(min_value=0)
    exit_code = serializers.IntegerField(required=False, allow_null=True, default=None)
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    node_rank = serializers.IntegerField(min_value=0, required=False, default=0)
    details = serializers.DictField(required=False, default=dict)


class LogSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(min_value=0)
    data = serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=1_000_000)
    offset = serializers.IntegerField(
        min_value=0, required=False,
        help_text="Characters of this sender's output for the attempt sent before this chunk: a chunk sent again "
                  "is stored once. Without it the chunk is appended.")
    stream = serializers.RegexField(
        r"^[A-Za-z0-9_-]{0,32}$", required=False, default="",
        help_text="The agent's sender of this output (a new one each time the agent starts the attempt): offsets "
                  "count within it.")


class ProgressSerializer(serializers.Serializer):
    """One record (`progress`), or the training records written since the last report (`records`, in order)."""

    attempt = serializers.IntegerField(min_value=0)
    progress = serializers.DictField(required=False)
    records = serializers.ListField(child=serializers.DictField(), required=False, max_length=MAX_PROGRESS_BATCH)

    def validate(self, attrs: dict) -> dict:
        if "progress" not in attrs and "records" not in attrs:
            raise serializers.ValidationError({"progress": ["Send a progress record or records."]})
        return attrs


# A report that does not apply (another host's job, an older attempt) is an AgentReportError: a 409 from the
# API's exception handler.
class JobStatusView(AgentView):
    @extend_schema(request=StatusSerializer, responses={200: OpenApiTypes.OBJECT, 409: ErrorSerializer})
    def post(self, request: Request, job_id: int) -> Response:
        form = StatusSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        job, counted = services.job_report_status(
            host=request.auth, job_id=job_id, status=JobStatus(**form.validated_data)
        )
        return Response({"state": job.state, "accepted": counted})


class JobLogView(AgentView):
    @extend_schema(request=LogSerializer, responses={200: OpenApiTypes.OBJECT, 409: ErrorSerializer})
    def post(self, request: Request, job_id: int) -> Response:
        form = LogSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        size = services.job_append_log(host=request.auth, job_id=job_id, **form.validated_data)
        return Response({"size": size})


class JobProgressView(AgentView):
    @extend_schema(request=ProgressSerializer, responses={200: OpenApiTypes.OBJECT, 409: ErrorSerializer})
    def post(self, request: Request, job_id: int) -> Response:
        form = ProgressSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.job_record_progress(host=request.auth, job_id=job_id, **form.validated_data)
        return Response({"ok": True})
