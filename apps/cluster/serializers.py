from rest_framework import serializers

from apps.accounts.models import Team
from apps.cluster.models import GPU, Host, Volume
from apps.cluster.volumes import host_path_problem, target_problem
from apps.core.serializers import RejectUnknownFieldsMixin, SlugLookupField


class GPUSerializer(serializers.ModelSerializer):
    class Meta:
        model = GPU
        fields = ["id", "index", "uuid", "gpu_type", "model_name", "memory_mb", "health", "health_reason"]
        read_only_fields = fields


class HostSerializer(serializers.ModelSerializer):
    gpus = GPUSerializer(many=True, read_only=True)

    class Meta:
        model = Host
        fields = ["id", "name", "state", "simulated", "last_heartbeat", "agent_version", "driver_version",
                  "cuda_version", "runtime", "job_isolation", "cached_images", "gpus"]
        read_only_fields = fields


class VolumeSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    """A volume as the API shows and takes it; the path rules are apps/cluster/volumes.py's, named per field."""

    name = serializers.SlugField(max_length=63)
    target = serializers.CharField(max_length=1024, required=False, allow_blank=True,
                                   help_text="Absolute path inside the job; blank: /mnt/<name>")
    teams = SlugLookupField(slug_field="slug", queryset=Team.objects.all(), many=True, required=False)

    class Meta:
        model = Volume
        fields = ["id", "name", "host_path", "target", "read_only", "teams", "all_teams", "description",
                  "created_at"]
        read_only_fields = ["id", "created_at"]

    def validate_name(self, value: str) -> str:
        if self.instance is not None and value != self.instance.name:
            raise serializers.ValidationError("A volume keeps its name (jobs name it); create another instead.")
        others = Volume.objects.filter(name=value)
        if self.instance is not None:
            others = others.exclude(pk=self.instance.pk)
        if others.exists():
            raise serializers.ValidationError(f"A volume named {value} already exists.")
        return value

    def validate_host_path(self, value: str) -> str:
        if problem := host_path_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_target(self, value: str) -> str:
        if value and (problem := target_problem(value)):
            raise serializers.ValidationError(problem)
        return value
