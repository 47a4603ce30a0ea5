from rest_framework import serializers

from apps.cluster.models import GPU, Host


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
                  "cuda_version", "runtime", "cached_images", "gpus"]
        read_only_fields = fields
