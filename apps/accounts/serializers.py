from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from rest_framework import serializers

from apps.accounts.models import ApiToken, Membership, Role, Team, TeamSecret, slug_validator
from apps.accounts.secrets import name_problem, value_problem
from apps.core.serializers import RejectUnknownFieldsMixin

User = get_user_model()


class TokenRequestSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, trim_whitespace=False, style={"input_type": "password"})
    name = serializers.CharField(max_length=100, required=False, default="api")
    expires_in_days = serializers.IntegerField(min_value=1, max_value=settings.API_TOKEN_MAX_DAYS, required=False)


class TokenCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(min_value=1, max_value=settings.API_TOKEN_MAX_DAYS, required=False)


class TokenSerializer(serializers.ModelSerializer):
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at", "active"]
        read_only_fields = fields


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret: shown once, never again.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class MembershipOfUserSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Membership
        fields = ["team", "role"]


class UserSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    password = serializers.CharField(write_only=True, required=False, max_length=256, trim_whitespace=False)
    memberships = MembershipOfUserSerializer(many=True, read_only=True)

    class Meta:
        model = User
        fields = ["id", "username", "email", "first_name", "last_name", "is_staff", "is_active", "password",
                  "memberships", "date_joined", "last_login"]
        read_only_fields = ["id", "memberships", "date_joined", "last_login"]

    def validate_password(self, value: str) -> str:
        validate_password(value)
        return value

    def create(self, validated_data: dict) -> User:
        password = validated_data.pop("password", None)
        user = User(**validated_data)
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
        return user

    def update(self, instance: User, validated_data: dict) -> User:
        password = validated_data.pop("password", None)
        for name, value in validated_data.items():
            setattr(instance, name, value)
        if password:
            instance.set_password(password)
        instance.save()
        return instance


class TeamSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    slug = serializers.CharField(max_length=49, validators=[slug_validator])
    name = serializers.CharField(max_length=120, required=False, allow_blank=True)

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "created_at"]
        read_only_fields = ["id", "created_at"]

    def validate_slug(self, value: str) -> str:
        others = Team.objects.filter(slug=value)
        if self.instance is not None:
            others = others.exclude(pk=self.instance.pk)
        if others.exists():
            raise serializers.ValidationError("A team with this slug already exists.")
        return value


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]
        read_only_fields = fields


class MembershipWriteSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)

    def validate_username(self, value: str) -> User:
        user = User.objects.filter(username=value, is_active=True).first()
        if user is None:
            raise serializers.ValidationError(f"No active user named '{value}'.")
        return user


class RoleSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


# --- team secrets (apps/accounts/secrets.py): names and versions; the value only in the answer that set it


class TeamSecretSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)

    class Meta:
        model = TeamSecret
        fields = ["name", "version", "created_by", "created_at", "rotated_at"]
        read_only_fields = fields


class NewSecretSerializer(TeamSecretSerializer):
    value = serializers.CharField(read_only=True, help_text="The value: shown in this answer only, never again.")

    class Meta(TeamSecretSerializer.Meta):
        fields = [*TeamSecretSerializer.Meta.fields, "value"]
        read_only_fields = fields


def _secret_value_field() -> serializers.CharField:
    # No trimming: a secret's spaces are its own. Length and NUL: value_problem, the service's own rule.
    return serializers.CharField(trim_whitespace=False, allow_blank=True)


class SecretCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=200)
    value = _secret_value_field()

    def validate_name(self, value: str) -> str:
        if problem := name_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_value(self, value: str) -> str:
        if problem := value_problem(value):
            raise serializers.ValidationError(problem)
        return value


class SecretRotateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    value = _secret_value_field()

    def validate_value(self, value: str) -> str:
        if problem := value_problem(value):
            raise serializers.ValidationError(problem)
        return value
