from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.accounts.models import Team
from apps.cluster.models import GPU, Host
from apps.jobs.models import Job


class GpuSampleBucket(models.Model):
    """Downsampled GPU history: one row per GPU per bucket (10 s for a day, 1 min for a month by default).

    Several rows may share a bucket (ingest in several processes); readers merge them.
    """

    gpu = models.ForeignKey(GPU, on_delete=models.CASCADE, related_name="sample_buckets")
    resolution_s = models.PositiveSmallIntegerField()
    bucket_start = models.DateTimeField()
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    samples = models.PositiveIntegerField()
    available_samples = models.PositiveIntegerField()
    utilization_avg = models.FloatField(null=True)
    utilization_max = models.FloatField(null=True)
    memory_used_max_mb = models.PositiveIntegerField(null=True)
    memory_total_mb = models.PositiveIntegerField(null=True)
    temperature_max = models.FloatField(null=True)
    power_avg_w = models.FloatField(null=True)
    energy_j = models.FloatField(default=0.0)

    class Meta:
        indexes = [models.Index(fields=["gpu", "resolution_s", "bucket_start"]),
                   models.Index(fields=["resolution_s", "bucket_start"])]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.bucket_start:%H:%M:%S} /{self.resolution_s}s"


class JobGpuStats(models.Model):
    """What a job's GPUs did over its lifetime, summed over its GPUs' samples."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="gpu_stats")
    samples = models.PositiveBigIntegerField(default=0)
    utilization_sum = models.FloatField(default=0.0)
    utilization_max = models.FloatField(default=0.0)
    memory_max_mb = models.PositiveIntegerField(default=0)
    energy_j = models.FloatField(default=0.0)
    first_sample_at = models.DateTimeField(null=True)
    last_sample_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"GPU stats of job {self.job_id}"

    @property
    def utilization_mean(self) -> float | None:
        return self.utilization_sum / self.samples if self.samples else None


class AlertRule(models.Model):
    class Kind(models.TextChoices):
        GPU_TEMPERATURE = "gpu_temperature", "GPU temperature at or above threshold (°C)"
        GPU_XID = "gpu_xid", "any XID error"
        GPU_MEMORY = "gpu_memory", "GPU memory use at or above threshold (%)"
        GPU_NO_DATA = "gpu_no_data", "GPU not answering"
        JOB_IDLE = "job_idle", "job holding GPUs below threshold utilization (%)"
        HOST_HEARTBEAT = "host_heartbeat", "host missing heartbeats"
        JOB_OVERRUN = "job_overrun", "job running past its expected end"
        SERVICE_LATENCY = "service_latency", "service p95 latency above its target × threshold"
        SERVICE_ERRORS = "service_errors", "service error rate at or above threshold (0-1)"
        LEDGER = "ledger", "GPU allocation records repaired by the periodic check"

    class Action(models.TextChoices):
        NONE = "none", "notify only"
        MARK_HOT = "mark_hot", "mark the GPU hot (no new jobs)"
        MARK_FAULTY = "mark_faulty", "mark the GPU faulty (no new jobs)"
        CHECKPOINT_JOB = "checkpoint_job", "mark the GPU and checkpoint and move its job"
        RELEASE_JOB = "release_job", "warn, then checkpoint and release the job"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    threshold = models.FloatField(default=0.0)
    duration_s = models.PositiveIntegerField(default=0, help_text="How long the condition must hold to fire.")
    action = models.CharField(max_length=20, choices=Action.choices, default=Action.NONE)
    severity = models.CharField(max_length=10, choices=[("warning", "warning"), ("critical", "critical")],
                                default="warning")
    enabled = models.BooleanField(default=True)
    notify_email = models.BooleanField(default=True)
    webhook_url = models.URLField(blank=True)
    teams = models.ManyToManyField(
        Team, blank=True, related_name="+",
        help_text="Teams whose jobs the action applies to (e.g. releasing idle jobs); empty means every team.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Alert(models.Model):
    class State(models.TextChoices):
        FIRING = "firing", "firing"
        ACKNOWLEDGED = "acknowledged", "acknowledged"
        RESOLVED = "resolved", "resolved"

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    state = models.CharField(max_length=15, choices=State.choices, default=State.FIRING, db_index=True)
    subject = models.CharField(max_length=120, help_text="What the alert is about, e.g. gpu:<uuid> or job:<id>.")
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    gpu = models.ForeignKey(GPU, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    message = models.CharField(max_length=500)
    value = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "subject"], condition=~models.Q(state="resolved"),
                                    name="one_open_alert_per_rule_and_subject")
        ]

    def __str__(self) -> str:
        return f"[{self.state}] {self.message}"


class ClusterSample(models.Model):
    """What the cluster looked like at one moment, written every 10 s by the beat task `telemetry.cluster_snapshot`
    and rolled up into 1-minute rows like the GPU buckets (apps/telemetry/retention.py).

    GPU counts are freshness.gpu_status's (busy, idle, stale, down). `teams` holds per team slug
    {"allocated", "borrowed", "quota", "queued", "wait_max_s", "wait_sum_s"} (GPUs, fractions exact to 1/100):
    readers filter it by what the viewer may see (access.Viewer.sees_team).
    """

    resolution_s = models.PositiveSmallIntegerField()
    bucket_start = models.DateTimeField()
    snapshots = models.PositiveIntegerField(default=1)
    gpus_busy = models.FloatField(default=0.0)
    gpus_idle = models.FloatField(default=0.0)
    gpus_stale = models.FloatField(default=0.0)
    gpus_down = models.FloatField(default=0.0)
    teams = models.JSONField(default=dict)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["resolution_s", "bucket_start"],
                                               name="one_cluster_sample_per_bucket")]

    def __str__(self) -> str:
        return f"cluster @ {self.bucket_start:%H:%M:%S} /{self.resolution_s}s"
