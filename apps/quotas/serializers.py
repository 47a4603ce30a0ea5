from __future__ import annotations

from rest_framework import serializers

from apps.core.serializers import RejectUnknownFieldsMixin
from apps.quotas.models import TeamQuota


class TeamQuotaSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    allowed_gpu_types = serializers.ListField(
        child=serializers.CharField(max_length=60), required=False, max_length=50
    )
    gpu_hours_per_month = serializers.DecimalField(max_digits=12, decimal_places=2, min_value=0, required=False)
    max_gpus = serializers.IntegerField(min_value=0, max_value=100_000, required=False)
    share = serializers.FloatField(min_value=0.0, max_value=1e6, required=False)

    class Meta:
        model = TeamQuota
        fields = ["team", "max_gpus", "gpu_hours_per_month", "when_budget_spent", "max_priority", "allowed_gpu_types",
                  "may_borrow", "share", "updated_at"]
        read_only_fields = ["team", "updated_at"]
