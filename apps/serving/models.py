from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.accounts.models import Team, slug_validator
from apps.jobs.models import Job


class InferenceService(models.Model):
    """A model served by replicas (inference jobs) behind the gateway, scaled between min and max replicas."""

    class State(models.TextChoices):
        ACTIVE = "active", "active"
        DELETING = "deleting", "deleting"
        DELETED = "deleted", "deleted"

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="services")
    name = models.CharField(max_length=49, validators=[slug_validator])
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="services")
    workload = models.CharField(max_length=60, blank=True,
                                help_text="Built-in workload whose model is served (empty: the service's image).")
    # A service from a user's image (docs/containers.md): its server's command in that image, plain variables and
    # the names of team secrets, checked as a job's (apps/jobs/container_spec.py).
    image = models.CharField(max_length=255, blank=True)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    secrets = models.JSONField(default=list, blank=True)
    checkpoint = models.CharField(max_length=300, blank=True,
                                  help_text="Artifact path of trained weights, '<job id>/outputs/model.pt'.")
    preset = models.CharField(max_length=60, default="infer-fp32")
    gpus_per_replica = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    min_replicas = models.PositiveSmallIntegerField(default=1, validators=[MaxValueValidator(64)])
    max_replicas = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1),
                                                                           MaxValueValidator(64)])
    target_p95_ms = models.FloatField(null=True, blank=True)
    target_rps_per_replica = models.FloatField(null=True, blank=True)
    max_batch = models.PositiveSmallIntegerField(default=32)
    max_wait_ms = models.FloatField(default=5.0)
    batching = models.BooleanField(default=True)
    desired_replicas = models.PositiveSmallIntegerField(default=1)
    last_scaled_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], condition=~models.Q(state="deleted"),
                                               name="one_live_service_name_per_team")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"


class ServiceReplica(models.Model):
    service = models.ForeignKey(InferenceService, on_delete=models.CASCADE, related_name="replicas")
    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="replica")
    retired = models.BooleanField(default=False, help_text="No longer counted: ended, or scaled away.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"replica job {self.job_id} of {self.service}"


class ServiceEvent(models.Model):
    service = models.ForeignKey(InferenceService, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=30)
    reason = models.CharField(max_length=500)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.service}: {self.kind} {self.reason}"
