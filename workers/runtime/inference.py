"""Inference presets: precision casts, torchao int8 quantization, torch.compile, and latency statistics."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

log = logging.getLogger("workers.runtime")


def quantize_int8_dynamic(model: nn.Module) -> int:
    """Dynamic int8 quantization of every nn.Linear with torchao; returns how many were quantized."""
    # torchao may print that its CUDA extensions failed to load on a CPU-only host; that is harmless.
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    linears = sum(1 for m in model.modules() if isinstance(m, nn.Linear))
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    quantized = count_quantized(model)
    log.info("torchao int8 dynamic quantization: %d/%d linear layers quantized", quantized, linears)
    return quantized


def count_quantized(model: nn.Module) -> int:
    """Linear layers whose weight is a torchao quantized tensor subclass."""
    return sum(1 for m in model.modules()
               if isinstance(m, nn.Linear) and type(m.weight).__module__.startswith("torchao"))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class LatencyStats:
    """Per-batch latencies (seconds) and the samples each batch held."""

    latencies: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    warmup_batches: int = 0

    def add(self, seconds: float, samples: int) -> None:
        self.latencies.append(seconds)
        self.samples.append(samples)

    def summary(self) -> dict[str, Any]:
        if not self.latencies:
            return {"batches": 0, "warmup_batches": self.warmup_batches}
        ms = np.asarray(self.latencies) * 1000.0
        total_s = float(np.sum(self.latencies))
        return {
            "batches": len(ms),
            "warmup_batches": self.warmup_batches,
            "latency_ms_p50": float(np.percentile(ms, 50)),
            "latency_ms_p95": float(np.percentile(ms, 95)),
            "latency_ms_p99": float(np.percentile(ms, 99)),
            "latency_ms_mean": float(ms.mean()),
            "samples": int(sum(self.samples)),
            "throughput_samples_per_s": sum(self.samples) / total_s if total_s > 0 else None,
        }


class Timer:
    """Wall time of a block, synchronized with the device so GPU work is counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._start
