"""Why a job may not take the GPUs a policy chose for it: the check a placement makes at the moment it happens.

The console's placement re-checks under its row locks (the snapshot a pass saw may be stale) and the simulator
checks every policy's decisions; both ask `placement_refusal`, which returns None when the placement holds.
A GPU holds jobs whose units (sharing.py) add up to at most FULL; a whole-GPU job takes all of it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from apps.scheduling.host_needs import host_need, meets
from apps.scheduling.sharing import FULL, fmt_gpus, held_units, is_fractional, units_on
from apps.scheduling.types import GpuView, HostView, PendingJob, RunningJob


def gpu_type_key(name: str) -> str:
    """The one spelling of a GPU type that registration, submission, quotas and placement compare: "h200 " and
    "H200" are the same type."""
    return name.strip().upper()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A GPU offered to a placement, with its host's state and the units its current allocations hold."""

    gpu: GpuView
    host: str = ""
    host_schedulable: bool = True
    units_in_use: int = 0
    host_view: HostView | None = None  # its host (None: unknown, which meets no need of a job's: host_needs)


def gpu_index(hosts: Iterable[HostView]) -> dict[int, tuple[HostView, GpuView]]:
    """gpu id -> (its host, the GPU)."""
    return {gpu.gpu_id: (host, gpu) for host in hosts for gpu in host.gpus}


def units_in_use(running: Iterable[RunningJob]) -> dict[int, int]:
    """gpu id -> units that running jobs hold on it (a fraction its share, a whole-GPU job FULL per GPU)."""
    used: dict[int, int] = defaultdict(int)
    for job in running:
        per_gpu = held_units(job) if is_fractional(job) else FULL
        for gpu_id in job.gpu_ids:
            used[gpu_id] += per_gpu
    return dict(used)


def candidates(
    gpu_ids: Sequence[int], index: Mapping[int, tuple[HostView, GpuView]], used: Mapping[int, int]
) -> list[Candidate] | None:
    """The candidates for `gpu_ids`, or None if one of them is not in the index (an unknown GPU)."""
    found = []
    for gpu_id in gpu_ids:
        entry = index.get(gpu_id)
        if entry is None:
            return None
        host, gpu = entry
        found.append(Candidate(gpu, host.name, host.schedulable, used.get(gpu_id, 0), host))
    return found


def placement_refusal(job: PendingJob, offered: Sequence[Candidate], units: int) -> str | None:
    """Why `job` may not take `offered` with `units` of each GPU (FULL for whole GPUs), or None if it may.

    Every GPU must be on a schedulable host (one that meets the job's need, host_needs), healthy, of the type the
    job asks for, with `units` left, and with the memory the job asks for; a fraction's units must cover its memory
    there (sharing.units_on; a GPU whose memory is unknown can take a memory-only job only whole).
    """
    if len(offered) != job.gpus or len({c.gpu.gpu_id for c in offered}) != len(offered):
        return f"needs {job.gpus} distinct GPUs, was offered {len(offered)}"
    if not 1 <= units <= FULL:
        return f"a share of {units} units is not between 1 and {FULL}"
    if units < FULL and not is_fractional(job):
        return "only a 1-GPU job may take part of a GPU"
    need = host_need(job)
    for c in offered:
        where = f"GPU {c.host}:{c.gpu.index}" if c.host else f"GPU {c.gpu.gpu_id}"
        if not c.host_schedulable:
            return f"{where}: its host takes no new jobs"
        if need is not None and (c.host_view is None or not meets(c.host_view, need)):
            return f"{where}: {need.refusal}"
        if not c.gpu.schedulable:
            return f"{where} takes no new jobs"
        if job.gpu_type and c.gpu.gpu_type != job.gpu_type:
            return f"{where} is a {c.gpu.gpu_type}, not a {job.gpu_type}"
        if c.units_in_use + units > FULL:
            return f"{where} has {fmt_gpus(max(0, FULL - c.units_in_use))} of a GPU free, not {fmt_gpus(units)}"
        memory = job.gpu_memory_mb
        if memory is not None and 0 < c.gpu.memory_mb < memory:
            return f"{where} has {c.gpu.memory_mb} MB of memory, not {memory} MB"
        if is_fractional(job):
            needed = units_on(job, c.gpu.memory_mb)
            if needed is not None and units < needed:
                return f"{where} needs {fmt_gpus(needed)} of a GPU for this job, not {fmt_gpus(units)}"
    return None
