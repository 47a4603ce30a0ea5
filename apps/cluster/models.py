from __future__ import annotations

from django.db import models

from workers.protocol import CONTAINER_RUNTIMES, JobIsolation


class Host(models.Model):
    class State(models.TextChoices):
        UP = "up", "up"
        DOWN = "down", "down"
        DRAINING = "draining", "draining"

    name = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.DOWN, db_index=True)
    drain = models.BooleanField(default=False, help_text="Kept draining across restarts until an admin ends it.")
    simulated = models.BooleanField(default=False, help_text="GPUs come from the simulated backend, not NVML.")
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    driver_version = models.CharField(max_length=40, blank=True)
    cuda_version = models.CharField(max_length=40, blank=True)
    address = models.CharField(max_length=200, blank=True, help_text="Address other hosts use to reach this one.")
    cpus = models.PositiveIntegerField(default=0, help_text="CPUs the agent may give jobs (0: not reported).")
    memory_mb = models.PositiveBigIntegerField(default=0, help_text="Host memory in MiB (0: not reported).")
    runtime = models.CharField(max_length=10, choices=[(r, r) for r in CONTAINER_RUNTIMES], default="process",
                               help_text="How the agent runs jobs: on the host (process) or in OCI containers.")
    job_isolation = models.CharField(
        max_length=12, blank=True, choices=[("", "not reported"), *[(m, m) for m in JobIsolation.MODES]],
        help_text="How the agent keeps process jobs apart (own-uid, shared-user, agent-user; blank: not reported). "
                  "Only own-uid hosts take a job given secrets without an image.")
    cached_images = models.JSONField(default=list, blank=True,
                                     help_text="The images in the host's container store, as the agent reported them.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue_name(self) -> str:
        return f"host.{self.name}"


class GPU(models.Model):
    class Health(models.TextChoices):
        OK = "ok", "ok"
        HOT = "hot", "hot"
        FAULTY = "faulty", "faulty"
        DRAINING = "draining", "draining"

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, unique=True)
    gpu_type = models.CharField(max_length=60, db_index=True, help_text="Short model name, e.g. H200.")
    model_name = models.CharField(max_length=120, blank=True, help_text="Full name reported by the driver.")
    memory_mb = models.PositiveIntegerField()
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.OK)
    health_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["host__name", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="one_gpu_per_host_index")]

    def __str__(self) -> str:
        return f"{self.host.name}:{self.index} ({self.gpu_type})"

    @property
    def schedulable(self) -> bool:
        return self.health == self.Health.OK


class HostCredential(models.Model):
    """The host agent's token, stored as a digest only."""

    host = models.OneToOneField(Host, on_delete=models.CASCADE, related_name="credential")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"credential of {self.host.name} ({self.prefix}…)"


class Volume(models.Model):
    """A named volume an admin defined: a path on the hosts (a local folder or a network file system mounted
    there) that jobs of the allowed teams mount by name at `target`. Rules on the paths: apps/cluster/volumes.py."""

    name = models.SlugField(max_length=63, unique=True)
    host_path = models.CharField(max_length=1024, help_text="Absolute path on every host that runs such jobs.")
    target = models.CharField(max_length=1024, help_text="Absolute path inside the job (default /mnt/<name>).")
    read_only = models.BooleanField(default=True)
    teams = models.ManyToManyField("accounts.Team", blank=True, related_name="volumes",
                                   help_text="Teams whose jobs may mount it.")
    all_teams = models.BooleanField(default=False, help_text="Every team's jobs may mount it.")
    description = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
