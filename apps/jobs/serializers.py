from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any, ClassVar

from django.conf import settings
from django.urls import reverse
from rest_framework import serializers

from apps.core.serializers import RejectUnknownFieldsMixin
from apps.jobs.colocating import sharing_data
from apps.jobs.container_spec import MAX_SHM_GB
from apps.jobs.models import MAX_JOB_CPUS, MAX_JOB_MEMORY_GB, MAX_STEPS, Job, JobEvent
from apps.jobs.selectors import attempt_allocations, believed_max_steps
from apps.jobs.submission import MAX_ARRAY_SIZE
from apps.quotas.models import Priority


class WorkloadField(serializers.JSONField):
    """`{"builtin": NAME, "params": {...}}` or `{"command": [argv...]}`: job_submit checks its shape
    (apps/jobs/workload_shape.py), for the pages and the CLI as for the API."""


class PositiveFloatField(serializers.FloatField):
    """A number strictly above zero (DRF's FloatField already refuses nan and inf; min_value would allow 0)."""

    def to_internal_value(self, data: Any) -> float:
        value = super().to_internal_value(data)
        if value <= 0:
            raise serializers.ValidationError("Must be greater than 0.")
        return value


class JobSubmitSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=200)
    team = serializers.SlugField(max_length=49, required=False)
    kind = serializers.ChoiceField(choices=Job.Kind.choices, default=Job.Kind.TRAIN)
    gpus = serializers.DecimalField(
        max_digits=6, decimal_places=2, min_value=Decimal("0.01"), max_value=4096,
        help_text="whole GPUs, or a fraction of one GPU (0.25, 0.5) to share it",
    )
    gpu_memory_gb = PositiveFloatField(
        min_value=0.1, max_value=10_000, required=False, allow_null=True,
        help_text="memory on one GPU; the job then shares that GPU (its share follows from the memory)",
    )
    gpu_type = serializers.CharField(max_length=60, required=False, allow_blank=True)
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.NORMAL)
    preset = serializers.CharField(max_length=60, required=False)
    workload = WorkloadField()
    max_steps = serializers.IntegerField(min_value=1, max_value=MAX_STEPS, required=False, allow_null=True)
    time_limit_minutes = serializers.IntegerField(
        min_value=1, max_value=settings.JOBS_MAX_TIME_LIMIT_MINUTES, required=False
    )
    max_retries = serializers.IntegerField(min_value=0, max_value=3, required=False, default=0)
    shareable = serializers.BooleanField(
        required=False, allow_null=True,
        help_text="a one-GPU job that may share its GPU with another shareable job when both leave it mostly idle "
                  "(measured); each then holds half of it; absent: the team's default")
    cpus = PositiveFloatField(
        max_value=MAX_JOB_CPUS, required=False, allow_null=True,
        help_text="CPUs the job may use (its cgroup's quota; may be fractional); default: a number per GPU the "
                  "admins set",
    )
    memory_gb = PositiveFloatField(
        max_value=MAX_JOB_MEMORY_GB, required=False, allow_null=True,
        help_text="host memory the job may use; past it the job fails as out of memory; default: per GPU",
    )

    image = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False,
                                  help_text="an OCI image to run the job in ([registry[:port]/]name[:tag][@sha256:"
                                            "digest]); none: the job runs on the host")
    env = serializers.JSONField(required=False, help_text='plain variables: {"NAME": "value"}')
    secrets = serializers.JSONField(required=False, help_text="names of the team's secrets to hand the job")
    mounts = serializers.JSONField(required=False, help_text="names of volumes (admin-defined) the team may use")
    code = serializers.JSONField(
        required=False, help_text='{"snapshot": ID} (POST /api/v1/code-snapshots/) or {"git": {"url": URL, "ref": '
                                  'REF}}; the command runs in the code folder')
    shm_gb = PositiveFloatField(max_value=MAX_SHM_GB, required=False, allow_null=True,
                                help_text="the container's /dev/shm (counts against memory_gb)")
    array_size = serializers.IntegerField(
        min_value=1, max_value=MAX_ARRAY_SIZE, required=False, allow_null=True,
        help_text="submit a job array: this many tasks, alike but for their index, which each sees as "
                  "CONSOLE_ARRAY_TASK_ID (0 to array_size - 1; Slurm's --array)")
    array_parallelism = serializers.IntegerField(
        min_value=1, max_value=MAX_ARRAY_SIZE, required=False, allow_null=True,
        help_text="with array_size: at most this many of its tasks hold GPUs at once (Slurm's --array=...%N)")

    def get_fields(self) -> dict[str, serializers.Field]:
        # DRF deep-copies the declared fields for every serializer, rebuilding each field and its validators: a
        # third of validating a submission. These fields keep no state of their own beyond what binding sets on
        # the copy (no child fields, validators never changed after __init__), so shallow copies are enough.
        return {name: copy.copy(field) for name, field in self._declared_fields.items()}

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        gpus: Decimal = data["gpus"]
        if gpus >= 1 and gpus != gpus.to_integral_value():
            raise serializers.ValidationError(
                {"gpus": ["Fractions are for a part of one GPU (e.g. 0.25 or 0.5); ask for whole GPUs above 1."]})
        if data.get("gpu_memory_gb") is not None and gpus > 1:
            raise serializers.ValidationError({"gpu_memory_gb": ["Memory is asked for on one GPU: use gpus ≤ 1."]})
        return data

    def to_spec_fields(self) -> dict[str, Any]:
        """The validated data as JobSpec fields: whole GPUs, or one GPU with a share in 1/100s."""
        data = dict(self.validated_data)
        gpus: Decimal = data.pop("gpus")
        memory_gb = data.pop("gpu_memory_gb", None)
        for name in ("cpus", "memory_gb", "shm_gb", "array_size", "array_parallelism"):
            if data.get(name) is None:
                data.pop(name, None)
        if gpus < 1:
            data.update(gpus=1, gpu_share_units=int(gpus * 100))
        else:
            data["gpus"] = int(gpus)
        if memory_gb is not None:
            data["gpu_memory_mb"] = int(memory_gb * 1024)
        return data


class AllocationSerializer(serializers.Serializer):
    share = serializers.SerializerMethodField()
    host = serializers.CharField(source="gpu.host.name")
    index = serializers.IntegerField(source="gpu.index")
    uuid = serializers.CharField(source="gpu.uuid")
    gpu_type = serializers.CharField(source="gpu.gpu_type")
    attempt = serializers.IntegerField(help_text="the job's attempt that held the GPU (0: not recorded)")

    def get_share(self, allocation) -> float:
        return allocation.share_units / 100


class JobSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)
    gpus = serializers.FloatField(source="gpus_requested", read_only=True)
    gpu_memory_gb = serializers.SerializerMethodField()
    allocations = serializers.SerializerMethodField()
    code = serializers.SerializerMethodField()
    backend = serializers.SerializerMethodField()
    resolved_image = serializers.SerializerMethodField()
    measured_slowdown = serializers.SerializerMethodField(
        help_text="step time while sharing its GPU over step time alone (null until both are measured)")
    sharing = serializers.SerializerMethodField(help_text="its GPU sharing and why (null: it never shared)")

    class Meta:
        model = Job
        fields = [
            "id", "name", "team", "user", "kind", "gpus", "gpu_memory_gb", "gpu_type", "cpus", "memory_gb", "priority", "preset",
            "workload", "max_steps", "image", "env", "secrets", "mounts", "code", "shm_gb", "backend",
            "resolved_image", "time_limit_minutes", "max_retries", "state", "pending_reason", "queue_position", "estimated_start",
            "estimate_confidence", "exit_code", "failure_reason", "attempts", "preemption_count", "steps_done",
            "steps_per_second", "samples_per_second", "last_steps_per_second", "last_samples_per_second", "last_loss",
            "runtime_info", "allocations", "created_at", "placed_at", "started_at", "finished_at",
            "shareable", "wait_fraction", "measured_slowdown", "sharing", "array_id", "array_index", "array_size",
            "array_parallelism",
        ]
        read_only_fields = fields

    _prototype_fields: ClassVar[dict[str, serializers.Field] | None] = None

    def get_fields(self) -> dict[str, serializers.Field]:
        # A ModelSerializer introspects the model for its fields on every instantiation (a tenth of a submission's
        # time); they are the same each time, so build them once per process and give each serializer copies.
        if type(self).__dict__.get("_prototype_fields") is None:
            type(self)._prototype_fields = super().get_fields()
        return copy.deepcopy(type(self)._prototype_fields)

    def get_gpu_memory_gb(self, job: Job) -> float | None:
        return round(job.gpu_memory_mb / 1024, 2) if job.gpu_memory_mb is not None else None

    def get_code(self, job: Job) -> dict[str, Any] | None:
        return code_data(job)

    def get_backend(self, job: Job) -> str | None:
        return backend_of(job)

    def get_resolved_image(self, job: Job) -> str:
        return resolved_image_of(job)

    def get_measured_slowdown(self, job: Job) -> float | None:
        return (job.colocation or {}).get("slowdown")

    def get_sharing(self, job: Job) -> dict[str, Any] | None:
        return sharing_data(job)

    def get_allocations(self, job: Job) -> list[dict[str, Any]]:
        return AllocationSerializer(attempt_allocations(job), many=True).data


class JobDetailSerializer(JobSerializer):
    """One job, as GET /api/v1/jobs/{id}/ gives it: the list's fields and what costs a query of its own."""

    believed_steps = serializers.SerializerMethodField(
        help_text="the steps the scheduler counts on where its user's finished runs ran fewer or more steps than "
                  "they declared: {steps, runs} (null: it believes max_steps as declared, or the job has ended)")

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "believed_steps"]
        read_only_fields = fields

    _prototype_fields: ClassVar[dict[str, serializers.Field] | None] = None

    def get_believed_steps(self, job: Job) -> dict[str, int] | None:
        return believed_steps_data(job)


def believed_steps_data(job: Job) -> dict[str, int] | None:
    """{steps the scheduler counts on, runs of its user's record that say so}, or None (jobs.selectors
    .believed_max_steps; asks the database only for a job that declares max_steps)."""
    believed = believed_max_steps(job)
    return None if believed is None else {"steps": believed[0], "runs": believed[1]}


def code_data(job: Job) -> dict[str, Any] | None:
    """The job's code: its snapshot (with where to download it) or its git repository at the recorded commit."""
    if job.code_snapshot_id is not None:
        return {"snapshot": str(job.code_snapshot_id),
                "download": reverse("code-snapshot-download", args=[job.code_snapshot_id])}
    if job.git_url:
        return {"git": {"url": job.git_url, "ref": job.git_ref, "commit": job.git_commit}}
    return None


def backend_of(job: Job) -> str | None:
    """What ran the job's latest attempt, as its agent reported ("process" from agents that do not say); None
    before any attempt ran."""
    if job.runtime_info.get("backend"):
        return str(job.runtime_info["backend"])
    return "process" if job.started_at is not None else None


def resolved_image_of(job: Job) -> str:
    """The image the latest attempt ran in, as the container runtime resolved it (name@digest)."""
    return str(job.runtime_info.get("image") or "")


_DATETIME = serializers.DateTimeField(read_only=True)


def submitted_job_data(job: Job) -> dict[str, Any]:
    """`JobSerializer(job).data` for a job just submitted (queued, no GPUs), built directly.

    Submission answers with the job it queued, and DRF's per-field machinery (copying 32 fields, then one call
    chain per field) cost a sixth of the request. tests/jobs pins this to JobSerializer's output, field by field.
    """

    def when(value: Any) -> str | None:
        return None if value is None else _DATETIME.to_representation(value)

    return {
        "id": job.id, "name": job.name, "team": job.team.slug, "user": job.user.username, "kind": job.kind,
        "gpus": float(job.gpus_requested),
        "gpu_memory_gb": round(job.gpu_memory_mb / 1024, 2) if job.gpu_memory_mb is not None else None,
        "gpu_type": job.gpu_type, "cpus": job.cpus, "memory_gb": job.memory_gb, "priority": job.priority, "preset": job.preset, "workload": job.workload,
        "max_steps": job.max_steps, "image": job.image, "env": job.env, "secrets": job.secrets,
        "mounts": job.mounts, "code": code_data(job), "shm_gb": job.shm_gb, "backend": backend_of(job),
        "resolved_image": resolved_image_of(job), "time_limit_minutes": job.time_limit_minutes, "max_retries": job.max_retries,
        "state": job.state, "pending_reason": job.pending_reason, "queue_position": job.queue_position,
        "estimated_start": when(job.estimated_start), "estimate_confidence": job.estimate_confidence,
        "exit_code": job.exit_code,
        "failure_reason": job.failure_reason, "attempts": job.attempts, "preemption_count": job.preemption_count,
        "steps_done": job.steps_done, "steps_per_second": job.steps_per_second,
        "samples_per_second": job.samples_per_second, "last_steps_per_second": job.last_steps_per_second,
        "last_samples_per_second": job.last_samples_per_second, "last_loss": job.last_loss,
        "runtime_info": job.runtime_info,
        "allocations": [], "created_at": when(job.created_at), "placed_at": when(job.placed_at),
        "started_at": when(job.started_at), "finished_at": when(job.finished_at),
        "shareable": job.shareable, "wait_fraction": job.wait_fraction,
        "measured_slowdown": (job.colocation or {}).get("slowdown"), "sharing": sharing_data(job),
        "array_id": job.array_id, "array_index": job.array_index, "array_size": job.array_size,
        "array_parallelism": job.array_parallelism, "believed_steps": believed_steps_data(job),
    }


class JobEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", read_only=True, default=None)

    class Meta:
        model = JobEvent
        fields = ["id", "created_at", "from_state", "to_state", "reason", "actor", "data"]
        read_only_fields = fields


class CancelSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
