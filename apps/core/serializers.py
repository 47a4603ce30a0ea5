from collections.abc import Mapping
from typing import Any

from django.http import QueryDict
from rest_framework import serializers

from apps.core.models import AuditEvent


def _text_with_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list | tuple):
        return any(isinstance(item, str) and "\x00" in item for item in value)
    return False


class RejectUnknownFieldsMixin:
    """A body naming a field the serializer does not have is a 400 naming it (`{"gpuz": ["Unknown field."]}`).

    DRF drops unknown fields silently: a typo (`gpuz`, `max_retry`) would submit a job other than the one meant.
    Read-only fields are known (a client may send back what it read). For request bodies, not query strings.
    """

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(name) for name in data if name not in self.fields)  # type: ignore[attr-defined]
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
            # A form body (QueryDict) holds several values per name; items() would show only the last.
            pairs = data.lists() if isinstance(data, QueryDict) else data.items()
            with_nul = sorted(str(name) for name, value in pairs if _text_with_nul(value))
            if with_nul:
                # Not every field validates text (slug relations look it up as is): PostgreSQL refuses NUL (a 500).
                raise serializers.ValidationError({name: ["Must not contain NUL bytes."] for name in with_nul})
        return super().to_internal_value(data)  # type: ignore[misc]


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor_name", "action", "target", "ip_address", "details"]
        read_only_fields = fields
