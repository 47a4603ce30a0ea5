"""The model, optimizer and data-loader transformations the presets are made of.

Each function does one thing and logs what it did; the session decides which ones a preset needs.
None of them changes parameter names, so checkpoints stay loadable across presets (pruning aside, whose
extra `*_orig`/`*_mask` entries are folded back by `make_pruning_permanent` before final weights are saved).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn
from torch.nn.utils import prune
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

log = logging.getLogger("workers.runtime")

CHECKPOINTED_ATTR = "_console_checkpointed"
_PRUNABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


# --- model structure ------------------------------------------------------------------------------------

def block_modules(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: elements of its ModuleLists, else its direct children with parameters.

    Activation checkpointing and FSDP sharding both work per block.
    """
    blocks = [m for child in model.modules() if isinstance(child, nn.ModuleList) for m in child]
    if blocks:
        return blocks
    return [child for child in model.children() if any(True for _ in child.parameters())]


def has_conv(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d | nn.Conv3d) for m in model.modules())


def has_batch_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- activation checkpointing ---------------------------------------------------------------------------

def apply_activation_checkpointing(model: nn.Module) -> int:
    """Recompute each block's activations during backward instead of storing them; returns the block count.

    The block's forward is replaced on the instance (no wrapper module), so state-dict keys do not change.
    """
    blocks = block_modules(model)
    for block in blocks:
        if getattr(block, CHECKPOINTED_ATTR, False):
            continue
        original = block.forward

        def forward(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(_original, *args, use_reentrant=False, **kwargs)

        block.forward = forward
        setattr(block, CHECKPOINTED_ATTR, True)
    log.info("activation checkpointing on %d blocks", len(blocks))
    return len(blocks)


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    return max(1, math.ceil(global_batch / (micro_batch * world_size)))


# --- pruning --------------------------------------------------------------------------------------------

def prunable_weights(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(m, "weight") for m in model.modules() if isinstance(m, _PRUNABLE)]


def apply_pruning(model: nn.Module, sparsity: float, method: str = "l1_unstructured") -> float:
    """Magnitude-prune Linear/Conv weights to `sparsity` (the fraction of zeros); returns the sparsity reached.

    The masks stay in place while fine-tuning, so pruned weights remain zero.
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    targets = prunable_weights(model)
    if method == "l1_unstructured":
        for module, name in targets:
            prune.l1_unstructured(module, name, amount=sparsity)
    elif method == "global_l1_unstructured":
        prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=sparsity)
    else:
        raise ValueError(f"unknown pruning method {method!r}")
    reached = weight_sparsity(model)
    log.info("pruned %d weight tensors (%s) to %.1f%% sparsity", len(targets), method, 100 * reached)
    return reached


def weight_sparsity(model: nn.Module) -> float:
    """Fraction of exactly-zero entries over the prunable weights (pruned or not)."""
    zeros = total = 0
    for module, name in prunable_weights(model):
        weight = getattr(module, name)
        zeros += int((weight == 0).sum())
        total += weight.numel()
    return zeros / total if total else 0.0


def make_pruning_permanent(model: nn.Module) -> None:
    for module in model.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(module, hook._tensor_name)


# --- distributed wrapping -------------------------------------------------------------------------------

def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    log.info("wrapping the model in DistributedDataParallel over %d processes", dist.get_world_size())
    return DistributedDataParallel(model, device_ids=device_ids)


def shard_fsdp2(model: nn.Module, param_dtype: torch.dtype | None) -> nn.Module:
    """FSDP2: shard each block, then the root; parameters become DTensors sharded over the ranks."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = block_modules(model)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    log.info("FSDP2: sharded %d blocks + root over %d processes (params in %s)", len(blocks),
             dist.get_world_size(), param_dtype or "fp32")
    return model


# --- optimizer ------------------------------------------------------------------------------------------

def rebuild_optimizer(optimizer: torch.optim.Optimizer, old_names: dict[int, str],
                      new_params: dict[str, nn.Parameter], *, fused: bool) -> torch.optim.Optimizer:
    """A fresh optimizer of the same class and hyper-parameters over `new_params` (matched by name).

    Needed after FSDP2 replaced the parameters with DTensors, or to switch to the fused implementation.
    """
    groups = []
    for group in optimizer.param_groups:
        hyper = {k: v for k, v in group.items() if k not in ("params", "fused", "foreach")}
        groups.append({**hyper, "params": [new_params[old_names[id(p)]] for p in group["params"]]})
    cls = type(optimizer)
    if fused:
        try:
            rebuilt = cls(groups, fused=True)
            log.info("using the fused %s implementation", cls.__name__)
            return rebuilt
        except (TypeError, RuntimeError, ValueError) as exc:
            log.warning("fused %s unsupported here (%s); using the default implementation", cls.__name__, exc)
    return cls(groups)


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer.defaults.get("fused"))


# --- data loading ---------------------------------------------------------------------------------------

class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start part-way through an epoch (to resume after preemption)."""

    start_index = 0

    def __iter__(self) -> Iterator[int]:
        return iter(list(super().__iter__())[self.start_index:])

    def __len__(self) -> int:
        return max(0, super().__len__() - self.start_index)


def rebuild_loader(loader: DataLoader, *, batch_size: int, world_size: int, rank: int, seed: int,
                   num_workers: int | None = None, pin_memory: bool | None = None,
                   prefetch_factor: int | None = None, drop_last: bool | None = None) -> DataLoader:
    """The same data with the requested batch size and loader tuning, through a ResumableSampler.

    The sampler is used with one process too: its per-epoch order is reproducible, which exact resume
    relies on.
    """
    if loader.batch_size is None or not isinstance(loader.sampler, RandomSampler | SequentialSampler):
        log.warning("data loader has a custom sampler; leaving it as it is (no sharding, no exact resume)")
        return loader
    shuffle = isinstance(loader.sampler, RandomSampler)
    drop_last = loader.drop_last if drop_last is None else drop_last
    sampler = ResumableSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                               seed=seed, drop_last=drop_last)
    workers = loader.num_workers if num_workers is None else num_workers
    options: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": loader.pin_memory if pin_memory is None else pin_memory,
        "collate_fn": loader.collate_fn,
        "drop_last": drop_last,
    }
    if workers > 0:
        options["persistent_workers"] = True
        options["prefetch_factor"] = prefetch_factor or loader.prefetch_factor or 2
        options["worker_init_fn"] = loader.worker_init_fn
    return DataLoader(loader.dataset, batch_size=batch_size, sampler=sampler, **options)


def move_to(batch: Any, device: torch.device, *, float_dtype: torch.dtype | None = None,
            channels_last: bool = False, non_blocking: bool = False) -> Any:
    """`batch` (tensor, or tuple/list/dict of them) on `device`; floats cast to `float_dtype` if given."""
    if isinstance(batch, torch.Tensor):
        out = batch.to(device, non_blocking=non_blocking)
        if float_dtype is not None and out.is_floating_point():
            out = out.to(float_dtype)
        if channels_last and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last)
        return out
    if isinstance(batch, dict):
        return {k: move_to(v, device, float_dtype=float_dtype, channels_last=channels_last,
                           non_blocking=non_blocking) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        moved = [move_to(v, device, float_dtype=float_dtype, channels_last=channels_last,
                         non_blocking=non_blocking) for v in batch]
        return tuple(moved) if isinstance(batch, tuple) else moved
    return batch


def batch_size_of(batch: Any) -> int:
    first = batch
    while isinstance(first, list | tuple) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() > 0 else 1


def inputs_of(batch: Any) -> Any:
    """By convention a batch is `inputs` or `(inputs, targets, ...)`."""
    return batch[0] if isinstance(batch, list | tuple) else batch


def named_parameter_ids(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}
