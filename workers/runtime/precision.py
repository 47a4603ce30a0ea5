"""Numeric precision: which dtype a preset asks for, what the device can do, autocast and loss scaling."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger("workers.runtime")

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    name: str  # the precision actually used: "fp32" | "bf16" | "fp16"
    device_type: str  # "cpu" | "cuda"
    requested: str
    autocast: bool
    grad_scaler: bool

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.name]

    @property
    def fell_back(self) -> bool:
        return self.name != self.requested

    def autocast_context(self) -> contextlib.AbstractContextManager[None]:
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        if not self.grad_scaler:
            return None
        return torch.amp.GradScaler(self.device_type)


def bf16_supported(device_type: str) -> bool:
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return True  # CPU autocast and bf16 kernels exist everywhere torch runs; speed varies by CPU.


def resolve(requested: str, device_type: str, *, autocast: bool = True) -> Precision:
    """The precision to use for `requested` on `device_type`, falling back (with a warning) when unsupported.

    fp16 needs a GPU: on a CPU it becomes bf16. bf16 on a GPU without bf16 support becomes fp16 + scaler.
    Loss scaling is only needed (and only enabled) for fp16.
    """
    if requested not in _DTYPES:
        raise ValueError(f"unknown precision {requested!r}; expected one of {', '.join(_DTYPES)}")
    name = requested
    if requested == "fp16" and device_type != "cuda":
        log.warning("precision fp16 needs a GPU; falling back to bf16 on %s", device_type)
        name = "bf16"
    elif requested == "bf16" and not bf16_supported(device_type):
        log.warning("this %s has no bf16 support; falling back to fp16 with loss scaling", device_type)
        name = "fp16"
    uses_autocast = autocast and name != "fp32"
    return Precision(name=name, device_type=device_type, requested=requested, autocast=uses_autocast,
                     grad_scaler=uses_autocast and name == "fp16")

