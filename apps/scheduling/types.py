"""The scheduler's input snapshot and output decisions.

Everything is immutable (PendingInfo by convention) and plain: the console builds a Snapshot from its database, the simulator builds one
from a trace, and a policy turns it into Decisions. Times are epoch seconds (floats); GPU ids are the console's
primary keys (the simulator numbers them itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apps.scheduling.prediction import RuntimeHistory


class Priority(IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2
    URGENT = 3

    @classmethod
    def from_name(cls, name: str) -> Priority:
        return cls[name.upper()]


@dataclass(frozen=True, slots=True)
class GpuView:
    gpu_id: int
    index: int
    gpu_type: str
    # False for GPUs marked hot, faulty or draining: they keep running jobs but receive no new ones.
    schedulable: bool = True
    # Memory of the GPU (0: unknown); jobs asking for gpu_memory_mb get a share of it (see sharing.py).
    memory_mb: int = 0


@dataclass(frozen=True, slots=True)
class HostView:
    name: str
    gpus: tuple[GpuView, ...]
    # False for hosts that are down or draining.
    schedulable: bool = True
    # True when its agent runs jobs in OCI containers (podman or docker): only such hosts take jobs with an image.
    runs_containers: bool = False
    # True when its agent runs each process job under a uid of its own in a private view (host_needs.OWN_UID).
    own_uid_jobs: bool = False


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: int
    team: str
    user: str
    gpus: int
    priority: Priority
    submitted_at: float
    gpu_type: str | None = None
    # GPU-seconds this job has already received (earlier runs before a preemption).
    attained_gpu_seconds: float = 0.0
    declared_steps: int | None = None
    steps_done: int = 0
    observed_step_s: float | None = None
    time_limit_s: float | None = None
    preemption_count: int = 0
    # Groups "similar" jobs of a user for runtime prediction (e.g. image + entry point, or model name).
    similarity_key: str | None = None
    # The amount of work the job asks for, where its workload says (a built-in's epochs: similarity.work_size);
    # run times of similar jobs are scaled by it.
    work_size: float | None = None
    # Non-preemptible jobs are never stopped for priority or shortest-first, and never borrow.
    preemptible: bool = True
    # A fraction of ONE GPU (only with gpus == 1; 0 < share < 1, kept to 1/100): see sharing.py.
    gpu_share: float = 1.0
    # Memory wanted on one GPU (only with gpus == 1): the job's share is then at least memory / GPU memory.
    gpu_memory_mb: int | None = None
    # The job runs in an OCI image: only hosts that run containers may take it (HostView.runs_containers).
    needs_containers: bool = False
    # A job without an image that is given secrets or volumes: only hosts that run it under a uid of its own
    # (host_needs).
    needs_own_uid: bool = False
    # A replica of an inference service: the service's replicas share this key (see preemption.py).
    service_group: str | None = None


@dataclass(frozen=True, slots=True)
class RunningJob:
    job_id: int
    team: str
    user: str
    gpus: int
    priority: Priority
    gpu_ids: tuple[int, ...]
    # When the current run started (after the last preemption, if any).
    started_at: float
    submitted_at: float
    gpu_type: str | None = None
    # GPU-seconds received BEFORE `started_at` (earlier runs); the policy adds (now - started_at) x gpus x share.
    attained_gpu_seconds: float = 0.0
    declared_steps: int | None = None
    # Steps done as of `steps_reported_at` (None: as of now); the predictor extrapolates from there.
    steps_done: int = 0
    observed_step_s: float | None = None
    time_limit_s: float | None = None
    preemption_count: int = 0
    # True when the job runs on GPUs borrowed beyond its team's quota (it may be reclaimed).
    borrowing: bool = False
    similarity_key: str | None = None
    work_size: float | None = None
    preemptible: bool = True
    steps_reported_at: float | None = None
    # The share it was placed with (Placement.gpu_share) and the memory it asked for.
    gpu_share: float = 1.0
    gpu_memory_mb: int | None = None
    needs_containers: bool = False  # (see PendingJob)
    needs_own_uid: bool = False  # (see PendingJob)
    service_group: str | None = None  # (see PendingJob)
    # Running (not only placed): for a replica, serving or about to.
    started: bool = True


@dataclass(frozen=True, slots=True)
class TeamQuotaView:
    team: str
    max_gpus: int
    # Optional per-user caps inside the team: user -> GPUs at once.
    user_max_gpus: dict[str, int] = field(default_factory=dict)
    share: float = 1.0
    # Recent usage (GPU-seconds, decayed) for fair share.
    recent_usage_gpu_seconds: float = 0.0
    may_borrow: bool = False
    # Fair share between the team's users: weights (default 1 each) and decayed recent usage.
    user_shares: dict[str, float] = field(default_factory=dict)
    user_recent_usage_gpu_seconds: dict[str, float] = field(default_factory=dict)
    # The team has used its GPU-hour budget for the period (usage.budget_spent): none of its jobs is placed, and
    # with `stop_when_spent` its running jobs are stopped (preempted: they checkpoint and wait in the queue).
    budget_spent: bool = False
    stop_when_spent: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    hosts: tuple[HostView, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...]
    quotas: dict[str, TeamQuotaView]
    # Finished runs of users' jobs, for predicting run times of jobs that declare no steps.
    history: RuntimeHistory | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: int
    gpu_ids: tuple[int, ...]
    borrowing: bool = False
    # Fraction of the (single) GPU allocated, in 1/100s; 1.0 for whole-GPU jobs. The console stores it with the
    # allocation and passes it back as RunningJob.gpu_share.
    gpu_share: float = 1.0


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: int
    reason: str
    # The waiting job it makes room for (None: stopped for another reason, such as a spent budget). Just before
    # sending it, the console asks preemption.still_needed whether that job could start without it by then.
    for_job: int | None = None
    # A move (defrag.py): the job is stopped only to start again at once on other GPUs, through no doing of its
    # own; it does not count among its preemptions (which raise its protection and end its borrowing).
    moved: bool = False


# Not frozen (a pass makes one for every waiting job, and a frozen dataclass costs five times as much to make on
# CPython 3.11: a tenth of a 10,000-job pass); treat it as immutable all the same.
@dataclass(slots=True)
class PendingInfo:
    reason: str
    position: int
    estimated_start: float | None = None
    # Machine-readable reason: quota, user_cap, borrow, no_gpu_type, no_runtime (no host meets what the job needs
    # of it: containers for an image, own uids for secrets without one; host_needs.py), too_large, budget (the team's GPU-hour budget is spent), priority, gang, backfill,
    # waiting (for GPUs behind jobs ahead), reserved (head of the queue, GPUs reserved for it).
    code: str = ""
    predicted_runtime_s: float | None = None
    # How far to trust estimated_start, in [0, 1]: how good past predictions of the jobs it waits on were.
    confidence: float | None = None


@dataclass(frozen=True, slots=True)
class Decisions:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    pending: dict[int, PendingInfo] = field(default_factory=dict)
    # When the policy would decide differently even if nothing else happens (a job reaching its minimum run
    # time, or crossing a priority threshold): a simulator or the console may run the next pass then.
    wake_at: float | None = None
