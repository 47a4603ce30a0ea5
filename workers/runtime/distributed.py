"""Process group setup for jobs launched under torchrun (NCCL on GPUs, gloo on CPU-only hosts)."""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

from .env import RuntimeEnv

log = logging.getLogger("workers.runtime")

_control_group: dist.ProcessGroup | None = None


def pick_device(env: RuntimeEnv) -> torch.device:
    if env.device:
        device = torch.device(env.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            log.warning("CONSOLE_DEVICE=%s but no GPU is visible; using the CPU", env.device)
            return torch.device("cpu")
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", env.local_rank % torch.cuda.device_count())
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_process_group(env: RuntimeEnv, device: torch.device) -> bool:
    """Join the job's process group when torchrun started several processes; True when one is active."""
    if not env.is_distributed:
        return False
    if dist.is_initialized():
        return True
    if "MASTER_ADDR" not in os.environ:
        raise RuntimeError("WORLD_SIZE > 1 but MASTER_ADDR is unset: launch multi-process jobs with torchrun")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)
    global _control_group
    # Control flags (e.g. "SIGTERM seen") go over a CPU group, so checking them every step does not
    # synchronise the GPU stream.
    _control_group = dist.new_group(backend="gloo") if backend == "nccl" else None
    log.info("rank %d/%d joined the process group (%s)", env.rank, env.world_size, backend)
    return True


def any_rank(flag: bool) -> bool:
    """True if `flag` is true on any rank (every rank must call this at the same point)."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_control_group)
    return bool(tensor.item())


def shutdown() -> None:
    global _control_group
    if dist.is_available() and dist.is_initialized():
        # Leave together: under gloo a rank that tears its connections down while a peer is still in its
        # last collective makes that peer abort (SIGABRT, seen in CI). A peer that already died makes the
        # barrier fail, and then there is nothing left to wait for.
        try:
            dist.barrier(group=_control_group)
        except RuntimeError as exc:
            log.warning("leaving the process group without its peers: %s", exc)
        dist.destroy_process_group()
    _control_group = None
