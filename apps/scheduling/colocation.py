"""Measured-utilization packing: which shareable jobs share one GPU, and when a pair is split again.

A job opts in (`shareable`). While it holds a whole GPU alone the console measures it: the mean SM utilization
and the peak memory of its GPU (telemetry), and from its runtime's progress records its step time and the share
of each step spent waiting on data or communication (`wait_fraction`). A shareable job that leaves its GPU
mostly idle (mean utilization under `max_utilization_pct`, measured over at least `min_samples` samples) is a
*resident*: a shareable job waiting in the queue (a *guest*) may then join it on that GPU, each holding half of
it (`PAIR_UNITS` of sharing.FULL units), through the fractional-GPU mechanisms the hosts have (MPS, or the
allocator cap and the memory watch).

Which guest goes where: the pair with the smallest predicted slowdown (interference.py's round model on the two
jobs' measured profiles, the GPU as the shared resource: see `profile`), and only pairs predicted under `max_predicted_slowdown`, whose memory fits in half a GPU each (with
`memory_headroom`), and that were not split before. A guest never measured (its first run) counts as busy at
the utilization threshold: sharing is then a trial, and the measured slowdown settles it.

The slowdown a pair really shows is each job's mean step time while paired over its mean step time alone (the
console records both from the progress records). Once each has `min_paired_reports` paired reports, a pair in
which either job is slowed by more than `max_slowdown` is split: the guest is requeued at its next checkpoint
and the two are never paired again.

Pure: no Django. The console's adapter (apps/operations/colocation.py) fills the inputs and applies the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from apps.scheduling.interference import Profile, slowdowns
from apps.scheduling.sharing import FULL

PAIR_UNITS = FULL // 2  # each job of a pair holds half of the GPU


@dataclass(frozen=True, slots=True)
class ColocationConfig:
    # A resident's mean SM utilization alone must be under this (and a measured guest's too).
    max_utilization_pct: float = 30.0
    # Samples of the job's GPU while it ran alone before its utilization counts as measured (1 s apart).
    min_samples: int = 15
    # Pairs predicted slower than this (for either job) are not formed.
    max_predicted_slowdown: float = 1.5
    # A pair measured slower than this for either job is split.
    max_slowdown: float = 1.5
    # Paired (and alone) progress reports needed before a measured slowdown is trusted.
    min_paired_reports: int = 5
    # Each job's measured peak memory must be under this part of its half of the GPU.
    memory_headroom: float = 0.9
    # Time lost per round to switching between the two jobs' contexts (a fraction of the round).
    switch_overhead: float = 0.05


@dataclass(frozen=True, slots=True)
class Measured:
    """What the console measured of a job while it ran alone (None: not measured yet)."""

    job_id: int
    utilization_pct: float | None = None
    samples: int = 0
    memory_mb: int | None = None
    wait_fraction: float | None = None
    step_s: float | None = None


@dataclass(frozen=True, slots=True)
class Resident:
    """A shareable job holding one whole GPU alone."""

    measured: Measured
    gpu_id: int
    gpu_memory_mb: int
    avoid: frozenset[int] = field(default_factory=frozenset)
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class Guest:
    """A shareable one-GPU job waiting in the queue (in queue order), measured on an earlier run or not."""

    measured: Measured
    avoid: frozenset[int] = field(default_factory=frozenset)
    gpu_type: str | None = None


@dataclass(frozen=True, slots=True)
class Pairing:
    resident: int
    guest: int
    gpu_id: int
    predicted_slowdown: float
    reason: str


def is_measured(measured: Measured, config: ColocationConfig) -> bool:
    return measured.utilization_pct is not None and measured.samples >= config.min_samples


def leaves_gpu_idle(measured: Measured, config: ColocationConfig) -> bool:
    """Measured alone, and its GPU mostly idle."""
    return is_measured(measured, config) and (measured.utilization_pct or 0.0) < config.max_utilization_pct


def profile(measured: Measured, config: ColocationConfig, step_if_unknown: float = 1.0) -> Profile:
    """The job's per-step profile for the interference model: (step, (seconds of the step it keeps the GPU busy,)).

    Only the GPU is counted as shared: each job waits on its own data loader or its own peers. The busy part is
    the larger of the measured utilization and the part of the step not spent waiting (the runtime's
    wait_fraction), so a job whose runtime says it computes more than telemetry saw is taken at its word. An
    unmeasured job counts as busy at the threshold (max_utilization_pct); one whose step time is unknown (it never
    reported progress alone) as stepping like its neighbour (`step_if_unknown`)."""
    step = measured.step_s or step_if_unknown
    utilization = measured.utilization_pct if is_measured(measured, config) else config.max_utilization_pct
    busy = (utilization or 0.0) / 100.0
    if measured.wait_fraction is not None:
        busy = max(busy, 1.0 - measured.wait_fraction)
    return step, (step * min(1.0, max(0.0, busy)),)


def predicted_slowdown(a: Measured, b: Measured, config: ColocationConfig) -> float:
    """The larger of the two jobs' predicted slowdowns when they share one GPU."""
    return max(slowdowns([profile(a, config, b.step_s or 1.0), profile(b, config, a.step_s or 1.0)],
                         config.switch_overhead))


def memory_fits(measured: Measured, gpu_memory_mb: int, config: ColocationConfig) -> bool:
    """Its measured peak memory fits in its half of the GPU (unknown memory on either side: no)."""
    if gpu_memory_mb <= 0:
        return False
    if measured.memory_mb is None:
        return True  # never ran: the memory watch holds it to its half
    return measured.memory_mb <= config.memory_headroom * gpu_memory_mb * PAIR_UNITS / FULL


def why(resident: Measured, guest: Measured, config: ColocationConfig) -> str:
    """Why the two share, in words for the job page."""
    limit = f"{config.max_utilization_pct:.0f} %"
    if is_measured(guest, config):
        measured = f"both measured under {limit} utilization ({resident.utilization_pct:.0f} % and " \
                   f"{guest.utilization_pct:.0f} %)"
    else:
        measured = f"job {resident.job_id} measured under {limit} utilization ({resident.utilization_pct:.0f} %), " \
                   f"job {guest.job_id} not measured yet (a trial)"
    return measured


def choose_pairs(residents: Sequence[Resident], guests: Sequence[Guest], config: ColocationConfig,
                 ) -> list[Pairing]:
    """Guests in queue order, each beside the resident it is predicted to slow least (ties: the idler one; each GPU
    takes one guest)."""
    free = [r for r in residents if leaves_gpu_idle(r.measured, config) and
            memory_fits(r.measured, r.gpu_memory_mb, config)]
    pairs: list[Pairing] = []
    for guest in guests:
        if is_measured(guest.measured, config) and not leaves_gpu_idle(guest.measured, config):
            continue
        best: tuple[float, float, Resident] | None = None
        for resident in free:
            if guest.measured.job_id in resident.avoid or resident.measured.job_id in guest.avoid:
                continue
            if guest.gpu_type and guest.gpu_type != resident.gpu_type:
                continue
            if not memory_fits(guest.measured, resident.gpu_memory_mb, config):
                continue
            slow = predicted_slowdown(resident.measured, guest.measured, config)
            # Ties (both well under a full GPU) go to the idler GPU.
            key = (slow, resident.measured.utilization_pct or 0.0)
            if slow <= config.max_predicted_slowdown and (best is None or key < best[:2]):
                best = (*key, resident)
        if best is None:
            continue
        slow, _, resident = best
        free.remove(resident)
        pairs.append(Pairing(resident=resident.measured.job_id, guest=guest.measured.job_id, gpu_id=resident.gpu_id,
                             predicted_slowdown=slow, reason=why(resident.measured, guest.measured, config)))
    return pairs


def measured_slowdown(alone_step_s: float | None, paired_step_s: float | None) -> float | None:
    """Step time while paired over step time alone (None until both are known)."""
    if not alone_step_s or not paired_step_s:
        return None
    return paired_step_s / alone_step_s


def should_split(slowdowns_measured: Sequence[float | None], paired_reports: Sequence[int],
                 config: ColocationConfig) -> bool:
    """Split when either job, measured over enough paired reports, is slowed beyond max_slowdown."""
    return any(s is not None and n >= config.min_paired_reports and s > config.max_slowdown
               for s, n in zip(slowdowns_measured, paired_reports, strict=True))
