from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from apps.jobs.models import Job, JobEvent
from apps.quotas.models import Priority

MAX_ARGS = 256
MAX_ARG_LENGTH = 4096


class WorkloadField(serializers.JSONField):
    """`{"builtin": NAME, "params": {...}}` or `{"command": [argv...]}`."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        data = super().to_internal_value(data)
        if not isinstance(data, dict):
            raise serializers.ValidationError('Expected {"builtin": NAME, "params": {...}} or {"command": [argv...]}.')
        keys = set(data)
        if keys & {"builtin", "command"} == {"builtin", "command"}:
            raise serializers.ValidationError("Give either 'builtin' or 'command', not both.")
        if "builtin" in data:
            unknown = keys - {"builtin", "params"}
            if unknown:
                raise serializers.ValidationError(f"Unknown keys: {', '.join(sorted(unknown))}.")
            if not isinstance(data["builtin"], str) or not data["builtin"]:
                raise serializers.ValidationError({"builtin": ["Must be a workload name."]})
            params = data.get("params", {})
            if not isinstance(params, dict):
                raise serializers.ValidationError({"params": ["Must be an object."]})
            return {"builtin": data["builtin"], "params": params}
        if "command" in data:
            unknown = keys - {"command"}
            if unknown:
                raise serializers.ValidationError(f"Unknown keys: {', '.join(sorted(unknown))}.")
            argv = data["command"]
            if not isinstance(argv, list) or not argv or not all(isinstance(arg, str) for arg in argv):
                raise serializers.ValidationError({"command": ["Must be a non-empty list of strings (argv)."]})
            if len(argv) > MAX_ARGS:
                raise serializers.ValidationError({"command": [f"At most {MAX_ARGS} arguments."]})
            if any(len(arg) > MAX_ARG_LENGTH or "\x00" in arg for arg in argv):
                raise serializers.ValidationError(
                    {"command": [f"Arguments must be at most {MAX_ARG_LENGTH} characters, without NUL bytes."]}
                )
            if not argv[0].strip():
                raise serializers.ValidationError({"command": ["The program name is empty."]})
            return {"command": argv}
        raise serializers.ValidationError("Give 'builtin' (a built-in workload) or 'command' (an argv list).")


class JobSubmitSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    team = serializers.SlugField(max_length=49, required=False)
    kind = serializers.ChoiceField(choices=Job.Kind.choices, default=Job.Kind.TRAIN)
    gpus = serializers.IntegerField(min_value=1, max_value=4096)
    gpu_type = serializers.CharField(max_length=60, required=False, allow_blank=True)
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.NORMAL)
    preset = serializers.CharField(max_length=60, required=False)
    workload = WorkloadField()
    max_steps = serializers.IntegerField(min_value=1, max_value=10**12, required=False, allow_null=True)
    time_limit_minutes = serializers.IntegerField(
        min_value=1, max_value=settings.JOBS_MAX_TIME_LIMIT_MINUTES, required=False
    )
    max_retries = serializers.IntegerField(min_value=0, max_value=3, required=False, default=0)


class AllocationSerializer(serializers.Serializer):
    host = serializers.CharField(source="gpu.host.name")
    index = serializers.IntegerField(source="gpu.index")
    uuid = serializers.CharField(source="gpu.uuid")
    gpu_type = serializers.CharField(source="gpu.gpu_type")


class JobSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)
    allocations = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "name", "team", "user", "kind", "gpus", "gpu_type", "priority", "preset", "workload", "max_steps",
            "time_limit_minutes", "max_retries", "state", "pending_reason", "queue_position", "estimated_start",
            "exit_code", "failure_reason", "attempts", "preemption_count", "steps_done", "steps_per_second",
            "samples_per_second", "last_loss", "allocations", "created_at", "placed_at", "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_allocations(self, job: Job) -> list[dict[str, Any]]:
        active = [a for a in job.allocations.all() if a.released_at is None]
        if not active and job.is_final:
            active = list(job.allocations.all())
        return AllocationSerializer(active, many=True).data


class JobEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", read_only=True, default=None)

    class Meta:
        model = JobEvent
        fields = ["id", "created_at", "from_state", "to_state", "reason", "actor", "data"]
        read_only_fields = fields


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
