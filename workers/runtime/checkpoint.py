"""Training checkpoints (for preemption and resume) and final model files.

Checkpoints hold full (unsharded, unwrapped) state dicts with parameter names as keys, so a job can resume
on another host, with another number of processes, or with the model wrapped differently (DDP, FSDP2,
torch.compile). Files are loaded with weights_only=True: nothing in them executes code.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

log = logging.getLogger("workers.runtime")

FORMAT = 1
_CKPT_RE = re.compile(r"^step-(\d+)\.pt$")
KEEP_LAST = 2


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["key"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _full_options() -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def training_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(model, optimizer) full state dicts; a collective under FSDP: every rank must call it."""
    if optimizer is None:
        return get_model_state_dict(model, options=_full_options()), None
    return get_state_dict(model, optimizer, options=_full_options())


def load_training_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, model_state: dict[str, Any],
                        optimizer_state: dict[str, Any] | None) -> None:
    options = StateDictOptions(full_state_dict=True)
    if optimizer is None or optimizer_state is None:
        set_model_state_dict(model, model_state, options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state,
                       options=options)


def _atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def is_main() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def save_checkpoint(directory: Path, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    extra: dict[str, Any]) -> Path:
    """Write step-<step>.pt into `directory` (rank 0 writes; every rank must call) and prune old ones."""
    model_state, optim_state = training_state(model, optimizer)
    path = directory / f"step-{step:08d}.pt"
    if is_main():
        _atomic_save({"format": FORMAT, "step": step, "model": model_state, "optimizer": optim_state,
                      "rng": rng_state(), **extra}, path)
        for old in list_checkpoints(directory)[:-KEEP_LAST]:
            old.unlink(missing_ok=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return path


def list_checkpoints(directory: Path | None) -> list[Path]:
    """Checkpoint files in `directory`, oldest step first."""
    if directory is None or not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: Path | None) -> Path | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def load_file(path: Path) -> dict[str, Any]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint written by this runtime (format {FORMAT})")
    return data


def save_model_file(path: Path, model_state: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Final weights for later inference jobs: fp32 CPU tensors plus what is needed to rebuild the model."""
    state = {k: v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().cpu()
             for k, v in model_state.items()}
    _atomic_save({"format": FORMAT, "kind": "model", "model": state, "meta": meta}, path)
    return path


def resume_latest(directory: Path | None, model: nn.Module,
                  optimizer: torch.optim.Optimizer | None) -> tuple[Path, dict[str, Any]] | None:
    """Load the newest checkpoint in `directory` into model and optimizer; returns (path, its other fields).

    Under torch.distributed rank 0 reads the file and broadcasts it (every rank must call this), so in a
    multi-host job only rank 0's host needs the checkpoint.
    """
    path = latest_checkpoint(directory) if is_main() else None
    data = load_file(path) if path is not None else None
    if not (dist.is_available() and dist.is_initialized()):
        if data is None or path is None:
            return None
        load_training_state(model, optimizer, data["model"], data.get("optimizer"))
        return path, {k: v for k, v in data.items() if k not in ("model", "optimizer")}
    header = [None if data is None else
              (str(path), {k: v for k, v in data.items() if k not in ("model", "optimizer")},
               data.get("optimizer") is not None)]
    dist.broadcast_object_list(header, src=0)
    if header[0] is None:
        return None
    path_text, fields, has_optimizer = header[0]
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    # Model and optimizer separately: set_state_dict() takes the other ranks' empty model state dict as
    # "optimizer only" and skips the model broadcast there, which deadlocks rank 0.
    set_model_state_dict(model, data["model"] if data is not None else {}, options=options)
    if optimizer is not None and has_optimizer:
        set_optimizer_state_dict(model, optimizer, data["optimizer"] if data is not None else {}, options=options)
    return Path(path_text), fields


def load_model_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state dict, meta) from a final model file or from a training checkpoint."""
    data = load_file(path)
    return data["model"], data.get("meta", {})
