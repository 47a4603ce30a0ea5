"""Process group setup for jobs launched under torchrun (NCCL on GPUs, gloo on CPU-only hosts)."""

from __future__ import annotations

import datetime
import gc
import logging
import os

import torch
import torch.distributed as dist

from .env import RuntimeEnv

log = logging.getLogger("workers.runtime")

_control_group: dist.ProcessGroup | None = None
# any_rank's flag goes through this one tensor, which Python holds until the group is left. A tensor made for
# each call could be freed last by a gloo worker thread after the call returned; when that happens while the
# interpreter is finalizing, the thread's GIL request ends it through pthread_exit and the rank dies of
# "terminate called without an active exception" (SIGABRT) after its work is done.
_flag: torch.Tensor | None = None


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
    global _flag
    if _flag is None:
        _flag = torch.zeros(1, dtype=torch.int32)
    _flag.fill_(1 if flag else 0)
    dist.all_reduce(_flag, op=dist.ReduceOp.MAX, group=_control_group)
    return bool(_flag.item())


def shutdown() -> None:
    global _control_group, _flag
    if dist.is_available() and dist.is_initialized():
        # Leave together: under gloo a rank that tears its connections down while a peer is still in its
        # last collective makes that peer abort (SIGABRT, seen in CI). A peer that already died makes the
        # barrier fail, and then there is nothing left to wait for.
        try:
            dist.barrier(group=_control_group)
        except RuntimeError as exc:
            log.warning("leaving the process group without its peers: %s", exc)
        dist.destroy_process_group()
    _control_group = _flag = None
    # What holds the group's backend only through reference cycles (model wrappers, their hooks) goes now, so
    # its threads are joined while the interpreter is whole rather than during finalization.
    gc.collect()
