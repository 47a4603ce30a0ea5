from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.accounts.models import Team
from apps.cluster.models import GPU
from apps.quotas.models import Priority
from apps.scheduling.usage import segment_gpu_seconds

# The largest max_steps a job may ask for: what its PositiveIntegerField holds on every database (PostgreSQL's
# integer), so a bigger one is a 400, never a database error.
MAX_STEPS = 2**31 - 1
# Bounds of a job's cpus and memory_gb whatever the hosts (a typo like 10**9 is a 400 even before any registers).
MAX_JOB_CPUS = 4096
MAX_JOB_MEMORY_GB = 65536


class CodeSnapshot(models.Model):
    """A team's uploaded code (a tar.gz in the artifact store, checked on upload): what a job starts in.

    The archive lives in the artifact store under CODE_SNAPSHOT_NAMESPACE/<id>.tar.gz; the row holds what the
    agent checks before unpacking it (digest, size) and what the job page shows.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="code_snapshots")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    files = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"code snapshot {self.pk} of {self.team_id} ({self.size} bytes)"


class Job(models.Model):
    class Kind(models.TextChoices):
        TRAIN = "train", "train"
        INFERENCE = "inference", "inference"

    class State(models.TextChoices):
        QUEUED = "queued", "queued"
        PLACED = "placed", "placed"
        RUNNING = "running", "running"
        SUCCEEDED = "succeeded", "succeeded"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"
        PREEMPTED = "preempted", "preempted"

    HOLDING_STATES = (State.PLACED, State.RUNNING)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

    name = models.CharField(max_length=200)
    # No index of their own: the (team, created_at) and (user, created_at) indexes below lead with them, and every
    # index is one more write on each submission.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.TRAIN)
    # A service's replicas share a group ("service:ID", set by apps.serving): the scheduler keeps one of them
    # serving when training of the same or a lower priority wants their GPUs. Empty for every other job.
    service_group = models.CharField(max_length=40, blank=True, default="")
    gpus = models.PositiveIntegerField()
    # A fraction of one GPU in 1/100s (100 = whole GPUs); gpu_memory_mb asks for memory on one GPU instead.
    gpu_share_units = models.PositiveSmallIntegerField(default=100)
    gpu_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    gpu_type = models.CharField(max_length=60, blank=True)
    # CPUs and host memory the job may use (its cgroup's limits), as granted at submission: what it asked for,
    # or the per-GPU defaults. Null for jobs from before: their hosts apply only the process-count limit.
    cpus = models.FloatField(null=True, blank=True)
    memory_gb = models.FloatField(null=True, blank=True)
    # Its environment (issue 16): an OCI image (empty: the job runs on the host), plain variables, the names of
    # team secrets (values are read at dispatch, never stored here), the names of volumes, its code, /dev/shm.
    image = models.CharField(max_length=255, blank=True)
    env = models.JSONField(default=dict, blank=True)
    secrets = models.JSONField(default=list, blank=True)
    mounts = models.JSONField(default=list, blank=True)
    code_snapshot = models.ForeignKey(CodeSnapshot, null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="jobs", db_index=False)
    git_url = models.CharField(max_length=2000, blank=True)
    git_ref = models.CharField(max_length=255, blank=True)
    git_commit = models.CharField(max_length=40, blank=True, help_text="The commit recorded at submission.")
    shm_gb = models.FloatField(null=True, blank=True)
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.NORMAL)
    preset = models.CharField(max_length=60)
    workload = models.JSONField()
    max_steps = models.PositiveIntegerField(null=True, blank=True)
    time_limit_minutes = models.PositiveIntegerField()
    max_retries = models.PositiveSmallIntegerField(default=0, help_text="Requeues after a lost host (at most 3).")
    # A task of a job array (Slurm's --array): `array_size` jobs submitted as one, alike but for their index (the
    # job sees CONSOLE_ARRAY_TASK_ID); `array_id` is the id of its first task. Null for a job submitted alone.
    array_id = models.PositiveBigIntegerField(null=True, blank=True, db_index=True)
    array_index = models.PositiveIntegerField(null=True, blank=True)
    array_size = models.PositiveIntegerField(null=True, blank=True)
    # At most this many of the array's tasks hold GPUs at once (Slurm's --array=...%N); null: no limit of its own.
    array_parallelism = models.PositiveIntegerField(null=True, blank=True)

    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    pending_reason = models.CharField(max_length=300, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    # How far to trust estimated_start, 0..1: how good past predictions of the jobs it waits on were.
    estimate_confidence = models.FloatField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_reason = models.CharField(max_length=500, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0, help_text="Times the job was placed.")
    preemption_count = models.PositiveSmallIntegerField(default=0)

    steps_done = models.PositiveBigIntegerField(default=0)
    # Over the current attempt's run so far (its result's figures once it ended); last_*: the latest interval.
    steps_per_second = models.FloatField(null=True, blank=True)
    samples_per_second = models.FloatField(null=True, blank=True)
    last_steps_per_second = models.FloatField(null=True, blank=True)
    last_samples_per_second = models.FloatField(null=True, blank=True)
    last_loss = models.FloatField(null=True, blank=True)
    # Per node of a multi-host run: node rank -> {"state", "exit_code", "reason"}; reset at each placement.
    node_results = models.JSONField(default=dict, blank=True)
    runtime_info = models.JSONField(default=dict, blank=True,
                                    help_text="What the job's process announced, e.g. the port a replica serves on.")
    borrowing = models.BooleanField(default=False, help_text="Runs on GPUs borrowed beyond the team's quota.")
    # Measured-utilization packing (apps/scheduling/colocation.py): the job may share its GPU with another
    # shareable job when both leave it mostly idle. `wait_fraction`: the newest share of a step its runtime spent
    # waiting on data. `colocation`: its pairing, kept after it ends (apps/jobs/colocating.py says what is in it).
    shareable = models.BooleanField(default=False, help_text="May share its GPU when it leaves it mostly idle.")
    wait_fraction = models.FloatField(null=True, blank=True)
    colocation = models.JSONField(default=dict, blank=True)
    preempt_requested_at = models.DateTimeField(null=True, blank=True)
    progress_at = models.DateTimeField(null=True, blank=True, help_text="When steps_done was last reported.")
    log_size = models.PositiveBigIntegerField(default=0, help_text="Characters of log stored.")
    log_truncated = models.BooleanField(default=False)
    # Characters of output received from each host for the current attempt ({"<attempt>/<host id>": n}): a chunk
    # an agent sends again is stored once (workers.protocol.unseen_output).
    log_streams = models.JSONField(default=dict, blank=True)
    metrics_dropped = models.PositiveBigIntegerField(
        default=0, help_text="Named metric values the job reported that were not kept (a bad name or value, too many).")

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["state", "team"]),
            models.Index(fields=["team", "created_at"]),
            # The per-user submission rate limit counts a user's jobs of the last minute on every submission.
            models.Index(fields=["user", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def is_fractional(self) -> bool:
        return self.gpus == 1 and (self.gpu_share_units < 100 or self.gpu_memory_mb is not None)

    @property
    def gpus_requested(self) -> float | int:
        """What the user asked for: whole GPUs, or a fraction such as 0.25."""
        return self.gpu_share_units / 100 if self.gpu_share_units < 100 else self.gpus


class JobAllocation(models.Model):
    """A GPU held by a job. At most one active (unreleased) allocation per GPU, enforced by the database."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(GPU, on_delete=models.PROTECT, related_name="allocations")
    # The part of the GPU held, in 1/100s. Shares on one GPU never add up to more than 100: placement checks it
    # under the GPU's row lock, and the database refuses a second whole-GPU allocation outright.
    share_units = models.PositiveSmallIntegerField(default=100)
    # The job's attempt (Job.attempts after the placement) that held it; 0 for rows from before it was kept.
    attempt = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(released_at__isnull=True, share_units=100),
                name="one_active_whole_allocation_per_gpu",
            )
        ]

    def __str__(self) -> str:
        return f"{self.gpu} for job {self.job_id}"


class UsageSegment(models.Model):
    """The usage ledger: one row per period a job held GPUs (from placement to release)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="usage_segments")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="usage_segments")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="usage_segments")
    gpus = models.PositiveIntegerField()
    share_units = models.PositiveSmallIntegerField(default=100, help_text="Part of each GPU held, in 1/100s.")
    started_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job"], condition=Q(ended_at__isnull=True), name="one_open_segment_per_job")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.gpus} GPUs from {self.started_at:%Y-%m-%d %H:%M} to {self.ended_at or 'now'}"

    @property
    def gpu_seconds(self) -> float | None:
        if self.ended_at is None:
            return None
        return segment_gpu_seconds(self.gpus, self.share_units, (self.ended_at - self.started_at).total_seconds())


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=10, blank=True)
    to_state = models.CharField(max_length=10, blank=True)
    reason = models.CharField(max_length=500)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state}->{self.to_state} {self.reason}"


class JobLogChunk(models.Model):
    """A piece of a job's output, in order. `offset` counts characters from the start of the log."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    offset = models.PositiveBigIntegerField()
    data = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "offset"]
        constraints = [models.UniqueConstraint(fields=["job", "offset"], name="one_log_chunk_per_offset")]

    def __str__(self) -> str:
        return f"job {self.job_id} log @{self.offset} ({len(self.data)} chars)"


class JobMetricSeries(models.Model):
    """One named series of a job's metrics ("loss", "steps_per_s", or the job's own "val_acc").

    Bounded (apps/jobs/metrics.py): a point is kept for every `stride`-th value received (its `seq` a multiple of
    `stride`) plus the newest one; when more than JOBS_METRIC_POINTS would be kept the stride doubles and the
    points off the new stride are deleted, so a long run stays evenly thinned.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_series")
    name = models.CharField(max_length=64)
    seen = models.PositiveBigIntegerField(default=0, help_text="Values received, kept or not.")
    stride = models.PositiveBigIntegerField(default=1)

    class Meta:
        ordering = ["job", "name"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="one_metric_series_per_name")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.name}"


class JobMetric(models.Model):
    """One kept value of a series: the `seq`-th the series received, at the job's `step` (when it said)."""

    series = models.ForeignKey(JobMetricSeries, on_delete=models.CASCADE, related_name="points")
    seq = models.PositiveBigIntegerField()
    attempt = models.PositiveSmallIntegerField()
    step = models.PositiveBigIntegerField(null=True)
    time = models.DateTimeField()
    value = models.FloatField()

    class Meta:
        ordering = ["series", "seq"]
        constraints = [models.UniqueConstraint(fields=["series", "seq"], name="one_metric_point_per_seq")]

    def __str__(self) -> str:
        return f"{self.series_id}#{self.seq} = {self.value}"
