"""Code snapshots over the API: upload (multipart `archive` and `team`), metadata and download for the team."""

from __future__ import annotations

from typing import cast

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import FileResponse, Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import access
from apps.core.errors import InvalidInput
from apps.core.schema import ErrorSerializer
from apps.jobs.code_snapshots import archive_name, code_snapshot_create, code_snapshot_open
from apps.jobs.models import CodeSnapshot
from workers.protocol import CODE_SNAPSHOT_MAX_BYTES

# The multipart envelope around the archive (boundaries, the team field): a body longer than the cap by more
# than this is refused before it is read.
_ENVELOPE = 64 * 1024


class CodeSnapshotSerializer(serializers.ModelSerializer):
    team: serializers.SlugRelatedField = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = CodeSnapshot
        fields = ["id", "team", "user", "sha256", "size", "files", "created_at"]
        read_only_fields = fields


class CodeSnapshotUploadSerializer(serializers.Serializer):
    team = serializers.SlugField(max_length=49)
    archive = serializers.FileField(help_text=f"a tar.gz of at most {CODE_SNAPSHOT_MAX_BYTES // 1024**2} MiB")


def _visible(request: Request) -> QuerySet[CodeSnapshot]:
    return access.restrict(CodeSnapshot.objects.select_related("team", "user"), request.user)


class CodeSnapshotsView(APIView):
    """Upload a job's code: a tar.gz (`archive`) for a team (`team`) you submit jobs in."""

    parser_classes = [MultiPartParser]

    @extend_schema(request={"multipart/form-data": CodeSnapshotUploadSerializer},
                   responses={201: CodeSnapshotSerializer})
    def post(self, request: Request) -> Response:
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > CODE_SNAPSHOT_MAX_BYTES + _ENVELOPE:
            raise InvalidInput({"archive": [f"An archive may hold at most {CODE_SNAPSHOT_MAX_BYTES // 1024**2} MiB."]})
        form = CodeSnapshotUploadSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        upload = form.validated_data["archive"]
        snapshot = code_snapshot_create(user=cast(User, request.user), team_slug=form.validated_data["team"],
                                        chunks=upload.chunks())
        return Response(CodeSnapshotSerializer(snapshot).data, status=status.HTTP_201_CREATED)


class CodeSnapshotView(APIView):
    @extend_schema(responses={200: CodeSnapshotSerializer, 404: ErrorSerializer})
    def get(self, request: Request, snapshot_id: str) -> Response:
        snapshot = _visible(request).filter(pk=snapshot_id).first()
        if snapshot is None:
            raise Http404("No such code snapshot.")
        return Response(CodeSnapshotSerializer(snapshot).data)


class CodeSnapshotDownloadView(APIView):
    @extend_schema(responses={(200, "application/gzip"): bytes, 404: ErrorSerializer})
    def get(self, request: Request, snapshot_id: str) -> FileResponse:
        snapshot = _visible(request).filter(pk=snapshot_id).first()
        if snapshot is None:
            raise Http404("No such code snapshot.")
        return snapshot_response(snapshot)


def snapshot_response(snapshot: CodeSnapshot) -> FileResponse:
    """The archive, with its digest (the agent checks it before unpacking)."""
    try:
        handle = code_snapshot_open(snapshot.pk)
    except (FileNotFoundError, ValueError):
        raise Http404("The code snapshot's archive is missing from the artifact store.") from None
    response = FileResponse(handle, as_attachment=True, filename=archive_name(snapshot.pk),
                            content_type="application/gzip")
    response["X-Content-SHA256"] = snapshot.sha256
    return response
