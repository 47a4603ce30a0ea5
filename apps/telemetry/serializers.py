from __future__ import annotations

from rest_framework import serializers

from apps.core.serializers import RejectUnknownFieldsMixin, SlugLookupField
from apps.telemetry.models import Alert, AlertRule


class AlertSerializer(serializers.ModelSerializer):
    rule = serializers.CharField(source="rule.name", read_only=True)
    severity = serializers.CharField(source="rule.severity", read_only=True)
    host = serializers.CharField(source="host.name", read_only=True, default=None)
    gpu = serializers.SerializerMethodField()
    team = serializers.CharField(source="team.slug", read_only=True, default=None)
    acknowledged_by = serializers.CharField(source="acknowledged_by.username", read_only=True, default=None)

    class Meta:
        model = Alert
        fields = ["id", "rule", "severity", "state", "message", "value", "host", "gpu", "job", "team", "started_at",
                  "acknowledged_at", "acknowledged_by", "resolved_at"]
        read_only_fields = fields

    def get_gpu(self, alert: Alert) -> str | None:
        return alert.gpu.uuid if alert.gpu_id else None


class AlertRuleSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    teams = SlugLookupField(slug_field="slug", many=True, required=False,
                            queryset=AlertRule.teams.rel.model.objects.all())

    class Meta:
        model = AlertRule
        fields = ["id", "name", "kind", "threshold", "duration_s", "action", "severity", "enabled", "notify_email",
                  "webhook_url", "teams"]
