"""The job API: what a running job may ask of the console with its attempt token (`Authorization: Job <token>`).

Its own record, its training progress, and its own artifacts (read all; write under checkpoints/ and outputs/).
The token works nowhere else (user and agent endpoints do not accept it) and only while its attempt runs.

One endpoint here serves the attempt's agent, not the job: the values of the job's team secrets
(JobSecretsView). The job token cannot fetch them (the job holds that token, and a job process could keep asking
after its container has started); the host token can, and only the host the attempt is placed on.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import cast

from django.conf import settings
from django.http import FileResponse, Http404
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, permissions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.cluster.authentication import AgentView
from apps.cluster.models import Host
from apps.core.errors import InvalidInput
from apps.core.machine_auth import KeywordTokenAuthentication, MachinePrincipal
from apps.core.schema import ErrorSerializer
from apps.jobs import services
from apps.jobs.api import ArtifactSerializer, artifact_download, artifact_listing, artifact_store
from apps.jobs.attempt_tokens import attempt_from_token
from apps.jobs.code_snapshot_api import snapshot_response
from apps.jobs.models import CodeSnapshot, Job
from workers.protocol import BUILTIN_METRICS, MAX_METRICS_PER_RECORD, JobSecrets, clean_metrics
from workers.runtime.artifacts import safe_relpath

WRITABLE_FOLDERS = ("checkpoints", "outputs")


@dataclass(frozen=True)
class JobPrincipal(MachinePrincipal):
    """A running job attempt: no person, no role in any team."""

    job: Job

    def get_username(self) -> str:
        return f"job:{self.job.pk}"


class JobTokenAuthentication(KeywordTokenAuthentication):
    keyword = "Job"
    unknown = "This job token is unknown, or its attempt no longer runs."

    def resolve(self, token: str) -> tuple[JobPrincipal, Job] | None:
        job = attempt_from_token(token)
        return (JobPrincipal(job), job) if job is not None else None


class StartingJobTokenAuthentication(JobTokenAuthentication):
    """The job token of an attempt that is placed or running: its agent fetches the job's code before starting."""

    def resolve(self, token: str) -> tuple[JobPrincipal, Job] | None:
        job = attempt_from_token(token, states=(Job.State.PLACED, Job.State.RUNNING))
        return (JobPrincipal(job), job) if job is not None else None


class JobTokenScheme(OpenApiAuthenticationExtension):
    target_class = JobTokenAuthentication
    name = "jobToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "Job <token>: CONSOLE_JOB_TOKEN inside a running job"}


class StartingJobTokenScheme(JobTokenScheme):
    target_class = StartingJobTokenAuthentication
    name = "jobTokenPlacedOrRunning"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "Job <token>: the attempt's job token (its agent's, in the dispatch), from placement on"}


class IsRunningJob(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Job)


class JobSelfView(APIView):
    """The running job's own record."""

    authentication_classes = [JobTokenAuthentication]
    permission_classes = [IsRunningJob]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 401: ErrorSerializer})
    def get(self, request: Request) -> Response:
        job: Job = request.auth
        return Response({"id": job.pk, "attempt": job.attempts, "name": job.name, "team": job.team.slug,
                         "user": job.user.username, "state": job.state, "kind": job.kind, "preset": job.preset,
                         "max_steps": job.max_steps, "steps_done": job.steps_done})


class OwnProgressSerializer(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, required=False)
    loss = serializers.FloatField(required=False)
    steps_per_s = serializers.FloatField(min_value=0, required=False)
    samples_per_s = serializers.FloatField(min_value=0, required=False)
    metrics = serializers.DictField(required=False, help_text="The job's own named metrics: {name: number}, a name "
                                    "an identifier of at most 64 characters (letters, digits, _ . / -)")

    def validate_metrics(self, value: dict) -> dict:
        kept, dropped = clean_metrics(value)
        if dropped:
            bad = sorted(str(name) for name in value if name not in kept)[:10]
            raise serializers.ValidationError(
                f"not kept: {', '.join(bad)} (names are short identifiers other than {', '.join(BUILTIN_METRICS)}; "
                f"values finite numbers; at most {MAX_METRICS_PER_RECORD} a report)")
        return kept


class JobSelfProgressView(JobSelfView):
    """Training progress the job reports itself (the runtime's progress file does the same through the agent)."""

    @extend_schema(request=OwnProgressSerializer, responses={200: OpenApiTypes.OBJECT, 401: ErrorSerializer})
    def post(self, request: Request) -> Response:
        form = OwnProgressSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.job_record_own_progress(job=request.auth, progress=dict(form.validated_data))
        return Response({"ok": True})


class JobSelfArtifactsView(JobSelfView):
    @extend_schema(responses={200: ArtifactSerializer(many=True), 401: ErrorSerializer})
    def get(self, request: Request) -> Response:
        return artifact_listing(request, request.auth.pk)


class JobSelfArtifactView(JobSelfView):
    """GET downloads one of the job's artifacts; PUT (raw body) stores one under checkpoints/ or outputs/."""

    @extend_schema(responses={(200, "application/octet-stream"): bytes, 401: ErrorSerializer, 404: ErrorSerializer})
    def get(self, request: Request, path: str) -> FileResponse:
        return artifact_download(request.auth.pk, path)

    @extend_schema(request={"application/octet-stream": bytes},
                   responses={201: ArtifactSerializer, 400: ErrorSerializer, 401: ErrorSerializer, 413: ErrorSerializer})
    def put(self, request: Request, path: str) -> Response:
        try:
            relpath = safe_relpath(path)
        except ValueError as exc:
            raise exceptions.ValidationError({"path": [str(exc)]}) from None
        if relpath.split("/", 1)[0] not in WRITABLE_FOLDERS or "/" not in relpath:
            raise exceptions.ValidationError({"path": [f"a job writes only under {' or '.join(WRITABLE_FOLDERS)}/"]})
        limit = settings.JOB_ARTIFACT_MAX_BYTES
        size = 0
        with tempfile.NamedTemporaryFile(prefix="job-artifact-") as spool:
            while chunk := request._request.read(1024 * 1024):  # the raw body, streamed: never all in memory
                size += len(chunk)
                if size > limit:
                    return Response({"detail": f"an artifact may hold at most {limit} bytes"},
                                    status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
                spool.write(chunk)
            spool.flush()
            artifact_store().put(str(request.auth.pk), relpath, spool.name)
        return Response({"path": relpath, "size": size}, status=status.HTTP_201_CREATED)


class JobSelfCodeView(APIView):
    """The job's uploaded code snapshot (a tar.gz, its digest in X-Content-SHA256), for its agent to unpack at
    workers.protocol.CODE_PATH (JOB_CODE_PATH). A job whose code is a git repository or none: 404."""

    authentication_classes = [StartingJobTokenAuthentication]
    permission_classes = [IsRunningJob]

    @extend_schema(responses={(200, "application/gzip"): bytes, 401: ErrorSerializer, 404: ErrorSerializer})
    def get(self, request: Request) -> FileResponse:
        job = cast(Job, request.auth)  # (IsRunningJob)
        snapshot = CodeSnapshot.objects.filter(pk=job.code_snapshot_id).first() if job.code_snapshot_id else None
        if snapshot is None:
            raise Http404("This job has no uploaded code.")
        return snapshot_response(snapshot)



class JobSecretsView(AgentView):
    """GET `?attempt=N`: the values of the job's team secrets, for the agent of the host the attempt is placed
    on, while it is placed or running (409 otherwise), just before it starts the job's container. The dispatch
    message names the secrets only; the values never cross the broker."""

    @extend_schema(parameters=[OpenApiParameter("attempt", int, required=True,
                                                description="the attempt the agent is about to start")],
                   responses={200: OpenApiTypes.OBJECT, 409: ErrorSerializer})  # 400, 401: apps.core.schema's
    def get(self, request: Request, job_id: int) -> Response:
        attempt = request.query_params.get("attempt", "")
        if not attempt.isdigit():
            raise InvalidInput({"attempt": ["The attempt number (a whole number) is required."]})
        values = services.job_secret_values(host=cast(Host, request.auth), job_id=job_id, attempt=int(attempt))
        response = Response(JobSecrets(attempt=int(attempt), values=values).to_message())
        response["Cache-Control"] = "no-store"
        return response
