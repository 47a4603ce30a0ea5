from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import django_filters
from django.conf import settings
from django.db.models import Prefetch, QuerySet
from django.http import FileResponse, Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import access
from apps.core.schema import ErrorSerializer
from apps.core.serializers import MAX_ROW_ID, RejectUnknownFieldsMixin
from apps.jobs import bulk, selectors, services, table
from apps.jobs.metrics import job_metrics, job_progress
from apps.jobs.models import Job, JobAllocation
from apps.jobs.serializers import (
    CancelSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobSerializer,
    JobSubmitSerializer,
    submitted_job_data,
)
from workers.protocol import METRIC_NAME
from workers.runtime.artifacts import artifact_store_from_url
from workers.runtime.catalog import PRESETS, WORKLOADS


class LogQuerySerializer(serializers.Serializer):
    after = serializers.IntegerField(min_value=0, default=0)
    limit = serializers.IntegerField(min_value=1, max_value=1_000_000, default=200_000)


class LogSliceSerializer(serializers.Serializer):
    data = serializers.CharField()
    next = serializers.IntegerField()
    complete = serializers.BooleanField()
    truncated = serializers.BooleanField()


class ArtifactSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()


# A job may write millions of files: a listing answers at most this many, in path order, and names the next page.
MAX_ARTIFACTS_PER_PAGE = 1000


class ArtifactQuerySerializer(serializers.Serializer):
    after = serializers.CharField(required=False, default="", allow_blank=True, max_length=4096,
                                  help_text="list the paths after this one (the previous page's last)")
    limit = serializers.IntegerField(min_value=1, max_value=MAX_ARTIFACTS_PER_PAGE, default=MAX_ARTIFACTS_PER_PAGE)


class MetricsQuerySerializer(serializers.Serializer):
    name = serializers.ListField(
        child=serializers.RegexField(rf"^(?:{METRIC_NAME.pattern})\Z", max_length=64), required=False, default=list,
        help_text="only these series (repeat, or separate with commas)")
    since_step = serializers.IntegerField(min_value=0, required=False, default=None, allow_null=True,
                                          help_text="only the points at steps after this one (live append)")


class MetricSeriesSerializer(serializers.Serializer):
    name = serializers.CharField()
    builtin = serializers.BooleanField(help_text="loss, steps_per_s or samples_per_s; else the job's own metric")
    seen = serializers.IntegerField(help_text="values received; at most max_points are kept, evenly thinned")
    stride = serializers.IntegerField(help_text="one point is kept for every `stride` values received (and the newest)")
    steps = serializers.ListField(child=serializers.IntegerField(allow_null=True))
    times = serializers.ListField(child=serializers.FloatField(), help_text="epoch seconds")
    values = serializers.ListField(child=serializers.FloatField())


class JobProgressSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    max_steps = serializers.IntegerField(allow_null=True)
    percent = serializers.FloatField(allow_null=True)
    eta_s = serializers.FloatField(allow_null=True, help_text="seconds left at the last rate (running jobs)")
    steps_per_s = serializers.FloatField(allow_null=True)
    loss = serializers.FloatField(allow_null=True)


class JobMetricsSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    state = serializers.CharField()
    max_points = serializers.IntegerField(help_text="the most points a series keeps")
    dropped = serializers.IntegerField(help_text="reported values not kept: bad names or values, too many series")
    progress = JobProgressSerializer()
    series = MetricSeriesSerializer(many=True)


class JobFilter(django_filters.FilterSet):
    """The jobs table's filters and sorting (apps/jobs/table.py; the jobs page reads the same parameters). A value
    that is not one of the choices is a 400 naming the parameter."""

    state = django_filters.MultipleChoiceFilter(choices=Job.State.choices)
    team = django_filters.CharFilter(field_name="team__slug")
    user = django_filters.CharFilter(field_name="user__username")
    kind = django_filters.ChoiceFilter(choices=Job.Kind.choices)
    name = django_filters.CharFilter(method="filter_name", max_length=200,
                                     help_text="jobs whose name contains this (any case)")
    mine = django_filters.BooleanFilter(method="filter_mine", help_text="true: only your own jobs")
    array = django_filters.NumberFilter(method="filter_array", min_value=1, max_value=MAX_ROW_ID,
                                        help_text="the tasks of this job array (its first task's id)")
    ordering = django_filters.ChoiceFilter(
        method="filter_ordering", choices=table.ordering_choices(),
        help_text=f"sort by {', '.join(table.ORDERINGS)} (a leading minus: descending); default "
                  f"{table.DEFAULT_ORDERING}")

    class Meta:
        model = Job
        fields = ["state", "team", "user", "kind", "name", "mine", "array", "ordering"]

    def filter_name(self, jobs: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        return table.filter_jobs(jobs, name=value)

    def filter_array(self, jobs: QuerySet[Job], name: str, value: Any) -> QuerySet[Job]:
        if value != int(value):
            raise serializers.ValidationError({"array": ["A job array's id is a whole number."]})
        return table.filter_jobs(jobs, array=int(value))

    def filter_mine(self, jobs: QuerySet[Job], name: str, value: bool | None) -> QuerySet[Job]:
        return table.filter_jobs(jobs, mine=self.request.user) if value else jobs

    def filter_ordering(self, jobs: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        return table.order_jobs(jobs, value) if value else jobs


class BulkCancelSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_ROW_ID), min_length=1,
                                max_length=bulk.MAX_BULK_CANCEL, help_text="the jobs to cancel")
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class CancelOutcomeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    cancelled = serializers.BooleanField()
    status = serializers.IntegerField(help_text="200 cancelled; 404 no such job (or not yours to see); 403 you may "
                                                "not cancel it; 409 it had already ended")
    detail = serializers.CharField()
    state = serializers.CharField(allow_null=True)


class BulkCancelResultSerializer(serializers.Serializer):
    cancelled = serializers.IntegerField()
    refused = serializers.IntegerField()
    results = CancelOutcomeSerializer(many=True)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs of the teams you belong to. Submit with POST; cancel with POST /{id}/cancel/, several with POST /cancel/."""

    serializer_class = JobSerializer
    filterset_class = JobFilter

    def get_serializer_class(self) -> type[JobSerializer]:
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    def get_queryset(self):
        allocations = JobAllocation.objects.select_related("gpu__host").order_by("gpu__host__name", "gpu__index")
        jobs = Job.objects.select_related("team", "user").prefetch_related(Prefetch("allocations", queryset=allocations))
        return access.restrict(jobs, self.request.user)

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # The table's filters choose the jobs of the list; a job's own routes take parameters of their own
        # (GET /{id}/metrics/?name=… names metrics, not jobs).
        return super().filter_queryset(queryset) if self.action == "list" else queryset

    @extend_schema(request=JobSubmitSerializer, responses={201: JobDetailSerializer, 429: ErrorSerializer})
    def create(self, request: Request) -> Response:
        form = JobSubmitSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        # A refusal (400 naming the field, 403, 429) is answered by apps.core.api.exception_handler.
        job = services.job_submit(
            user=request.user, spec=services.JobSpec(**form.to_spec_fields()), request=request._request
        )
        # The job as created (reading it back through the visibility query cost a quarter of the request); an
        # array's first task, with the ids of all its tasks.
        data = submitted_job_data(job)
        if job.array_id is not None:
            data["array_job_ids"] = selectors.array_task_ids(job.array_id)
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(request=CancelSerializer, responses={200: JobSerializer, 409: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        form = CancelSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.job_cancel(job=job, actor=request.user, reason=form.validated_data["reason"],
                            request=request._request)  # 403 unless it may, 409 when already finished
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(request=BulkCancelSerializer, responses=BulkCancelResultSerializer, operation_id="v1_jobs_bulk_cancel",
                   description="Cancel several jobs: one result per id, in order. A job you may not cancel, or one "
                               "already ended, is reported and the others are still cancelled.")
    @action(detail=False, methods=["post"], url_path="cancel", url_name="bulk-cancel")
    def bulk_cancel(self, request: Request) -> Response:
        form = BulkCancelSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        outcomes = bulk.jobs_cancel(ids=form.validated_data["ids"], actor=request.user,
                                    reason=form.validated_data["reason"], request=request._request)
        done = sum(o.cancelled for o in outcomes)
        return Response({"cancelled": done, "refused": len(outcomes) - done,
                         "results": [o.as_dict() for o in outcomes]})

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        page = self.paginate_queryset(selectors.job_events(job))
        return self.get_paginated_response(JobEventSerializer(page, many=True).data)


    @extend_schema(
        parameters=[OpenApiParameter("after", int, description="character offset to read from (0 = start)"),
                    OpenApiParameter("limit", int, description="at most about this many characters")],
        responses=LogSliceSerializer,
    )
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        params = LogQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        data, next_offset = selectors.job_log_slice(job, params.validated_data["after"],
                                                    params.validated_data["limit"])
        complete = job.is_final and next_offset >= job.log_size
        return Response({"data": data, "next": next_offset, "complete": complete, "truncated": job.log_truncated})

    @extend_schema(
        parameters=[OpenApiParameter("name", str, many=True, description="only these series (repeat, or comma-separated)"),
                    OpenApiParameter("since_step", int, description="only the points at steps after this one")],
        responses=JobMetricsSerializer,
        description="The job's kept metrics: loss, steps/s, samples/s and the job's own named metrics, one series "
                    "each, as columns; a series keeps at most `max_points` points, evenly thinned over the run.",
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        names = [n for value in request.query_params.getlist("name") for n in value.split(",") if n]
        query = MetricsQuerySerializer(data={"name": names, "since_step": request.query_params.get("since_step")})
        query.is_valid(raise_exception=True)
        return Response({"job": job.pk, "state": job.state, "max_points": settings.JOBS_METRIC_POINTS,
                         "dropped": job.metrics_dropped, "progress": job_progress(job),
                         "series": job_metrics(job, query.validated_data["name"], query.validated_data["since_step"])})

    @extend_schema(
        parameters=[ArtifactQuerySerializer],
        responses=ArtifactSerializer(many=True),
        description=f"At most `limit` ({MAX_ARTIFACTS_PER_PAGE}) files in path order; when more follow, the answer "
                    "has `X-Truncated: true` and a `Link: <…?after=LAST>; rel=\"next\"` header.",
    )
    @action(detail=True, methods=["get"])
    def artifacts(self, request: Request, pk: str | None = None) -> Response:
        return artifact_listing(request, self.get_object().pk)

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    @action(detail=True, methods=["get"], url_path=r"artifacts/(?P<path>.+)")
    def artifact(self, request: Request, pk: str | None = None, path: str = "") -> FileResponse:
        return artifact_download(self.get_object().pk, path)


def artifact_listing(request: Request, job_id: int) -> Response:
    """One page of a job's artifacts (the user API and the job API)."""
    query = ArtifactQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    after, limit = query.validated_data["after"], query.validated_data["limit"]
    files = artifact_store().list_page(str(job_id), after=after, limit=limit + 1)
    response = Response([{"path": path, "size": size} for path, size in files[:limit]])
    if len(files) > limit:
        response["X-Truncated"] = "true"
        next_url = request.build_absolute_uri(f"?{urlencode({'after': files[limit - 1][0], 'limit': limit})}")
        response["Link"] = f'<{next_url}>; rel="next"'
    return response


def artifact_download(job_id: int, path: str) -> FileResponse:
    try:
        handle = artifact_store().open(str(job_id), path)
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        raise Http404("No such artifact.") from None  # what the console may not read is not served either
    return FileResponse(handle, as_attachment=True, filename=path.rsplit("/", 1)[-1])


def artifact_store():
    return artifact_store_from_url(settings.ARTIFACT_STORE_URL)


class PresetsView(APIView):
    """The optimization presets a job may name."""

    @extend_schema(responses=serializers.ListSerializer(child=serializers.DictField()))
    def get(self, request: Request) -> Response:
        return Response([preset.as_dict() for preset in PRESETS.values()])


class WorkloadsView(APIView):
    """The built-in workloads, with their parameters."""

    @extend_schema(responses=serializers.ListSerializer(child=serializers.DictField()))
    def get(self, request: Request) -> Response:
        return Response([workload.as_dict() for workload in WORKLOADS.values()])
