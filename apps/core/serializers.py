from rest_framework import serializers

from apps.core.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor_name", "action", "target", "ip_address", "details"]
        read_only_fields = fields
