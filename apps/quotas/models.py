from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.accounts.models import Team


class Priority(models.TextChoices):
    LOW = "low", "low"
    NORMAL = "normal", "normal"
    HIGH = "high", "high"
    URGENT = "urgent", "urgent"


PRIORITY_RANK = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2, Priority.URGENT: 3}


class TeamQuota(models.Model):
    class WhenBudgetSpent(models.TextChoices):
        FINISH = "finish", "running jobs finish"
        STOP = "stop", "running jobs checkpoint and stop"

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    max_gpus = models.PositiveIntegerField(default=0, help_text="GPUs the team may hold at once.")
    gpu_hours_per_month = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        default=0,
        validators=[MinValueValidator(0)],
        help_text="GPU-hour budget per calendar month (UTC); 0 means unlimited.",
    )
    when_budget_spent = models.CharField(
        max_length=10, choices=WhenBudgetSpent.choices, default=WhenBudgetSpent.FINISH,
        help_text="Once the monthly budget is spent no new job starts; this says what running jobs do: finish, or "
        "stop (preempted: they checkpoint and wait in the queue).",
    )
    max_priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.HIGH)
    allowed_gpu_types = models.JSONField(
        default=list, blank=True, help_text="GPU types the team may use, e.g. [\"H200\"]; empty allows every type."
    )
    may_borrow = models.BooleanField(
        default=True, help_text="Jobs may borrow idle GPUs beyond max_gpus as preemptible capacity."
    )
    share = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.0), MaxValueValidator(1e6)], help_text="Fair-share weight."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team__slug"]

    def __str__(self) -> str:
        return f"quota of {self.team.slug}"


class UserQuota(models.Model):
    """An optional cap on one user inside a team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="user_quotas")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="user_quotas")
    max_gpus = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_user_quota_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}: {self.max_gpus} GPUs"


class QuotaRequest(models.Model):
    """A manager's request for more quota; a site admin approves (applied through quota_update) or rejects it."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        APPROVED = "approved", "approved"
        REJECTED = "rejected", "rejected"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quota_requests")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    max_gpus = models.PositiveIntegerField(null=True, blank=True, help_text="GPUs at once asked for (blank: unchanged).")
    gpu_hours_per_month = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(0)],
        help_text="Monthly GPU-hour budget asked for (blank: unchanged; 0: unlimited).",
    )
    reason = models.TextField(max_length=2000)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"quota request {self.pk} of {self.team.slug} ({self.state})"
