from __future__ import annotations

import re

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

slug_validator = RegexValidator(r"^[a-z0-9][a-z0-9-]{0,48}$", "Use 1-49 lowercase letters, digits and dashes.")


class Role(models.TextChoices):
    VIEWER = "viewer", "viewer"
    MEMBER = "member", "member"
    MANAGER = "manager", "manager"


ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.MANAGER: 2}


class Team(models.Model):
    slug = models.SlugField(max_length=49, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=120)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]
        ordering = ["team__slug", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} as {self.role}"


class ApiToken(models.Model):
    """A personal API token. Only a SHA-256 digest is stored: the secret is shown once, at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True, help_text="First characters, to recognise a token.")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) of {self.user}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}\Z")
secret_name_validator = RegexValidator(
    SECRET_NAME, "Use 1-64 capital letters, digits and underscores, not starting with a digit.")


class TeamSecret(models.Model):
    """A team's secret (a W&B key …), handed to the team's jobs that name it. The value is stored only encrypted
    (apps/accounts/secret_box.py); the API shows it once, when it is created or rotated."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=64, validators=[secret_name_validator])
    ciphertext = models.TextField(help_text="The value, encrypted (Fernet); never the plain value.")
    version = models.PositiveIntegerField(default=1, help_text="1 at creation, one more at each rotation.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_secret_name_per_team")]
        ordering = ["team__slug", "name"]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name} (v{self.version})"
