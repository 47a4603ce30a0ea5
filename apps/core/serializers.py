from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from apps.core.models import AuditEvent

# The largest row id a database stores (a signed 64-bit integer): a larger one is no row, and SQLite refuses to
# even compare with it (OverflowError, a 500), so id fields in request bodies stop there.
MAX_ROW_ID = 2**63 - 1


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
        return super().to_internal_value(data)  # type: ignore[misc]


class SlugLookupField(serializers.SlugRelatedField):
    """A slug relation that refuses a NUL byte before looking it up: PostgreSQL refuses one in a query (a 500).

    DRF's CharField already refuses NUL bytes; its SlugRelatedField queries with the text as given.
    """

    default_error_messages = {**serializers.SlugRelatedField.default_error_messages,
                              "nul": "Must not contain NUL bytes."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("nul")
        return super().to_internal_value(data)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor_name", "action", "target", "ip_address", "details"]
        read_only_fields = fields
