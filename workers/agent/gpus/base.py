"""The GPU backend interface shared by the NVML and the simulated backend.

Everything here is plain data: the agent turns samples into its own reports.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

log = logging.getLogger("workers.agent.gpus")

NO_DRIVER_HINT = "use --simulate 4xH200 to run with simulated GPUs"


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str  # full model name as the driver reports it, e.g. "NVIDIA H200"
    gpu_type: str  # short model, e.g. "H200" (see gpu_type_from_name)
    memory_mb: int


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    memory_mb: int | None  # None where the driver cannot tell (e.g. some containers)


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU.

    ``available=False`` means "no data": the GPU stopped answering (lost, hung, stuck). Every metric is
    then None; a consumer must show a gap, never 0 %.
    """

    index: int
    uuid: str
    ts: float  # epoch seconds when sampled
    available: bool
    utilization_pct: float | None = None  # SM busy %
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    memory_bandwidth_pct: float | None = None  # memory controller busy %
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    fan_pct: int | None = None  # None on passively cooled boards
    throttle_reasons: list[str] = field(default_factory=list)
    ecc_errors_volatile: int | None = None  # uncorrected ECC errors since the driver loaded
    processes: list[ProcessUsage] = field(default_factory=list)
    # When ``processes`` was read (it is refreshed less often than the rest); None: never read yet.
    processes_ts: float | None = None
    error: str | None = None  # why available is False, when known (e.g. "GPU is lost")


@dataclass(frozen=True)
class XidEvent:
    index: int
    uuid: str
    xid: int
    ts: float


class NoGpuBackend(RuntimeError):
    """No usable GPU backend on this host (no NVIDIA driver, no GPUs, ...); the agent catches this."""

    def __init__(self, message: str, *, reason: str = "", cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.cause = cause


@runtime_checkable
class GpuBackend(Protocol):
    kind: str  # "nvml" or "simulated"

    def devices(self) -> list[GpuDevice]: ...

    def driver_info(self) -> dict[str, str]: ...

    def sample(self) -> list[GpuSample]: ...

    def attach_job(self, index: int, job_id: int, pid: int, memory_limit_mb: int | None = None) -> None: ...

    def detach_job(self, index: int, job_id: int) -> None: ...

    def poll_xid_events(self, timeout_ms: int) -> list[XidEvent]: ...

    def close(self) -> None: ...


# Clock-event ("throttle") reason bits, identical in nvmlClocksEventReason* and nvmlClocksThrottleReason*.
THROTTLE_REASON_NAMES: dict[int, str] = {
    0x001: "GPU idle",
    0x002: "applications clocks setting",
    0x004: "SW power cap",
    0x008: "HW slowdown",
    0x010: "sync boost",
    0x020: "SW thermal slowdown",
    0x040: "HW thermal slowdown",
    0x080: "HW power brake slowdown",
    0x100: "display clock setting",
}


def throttle_reason_names(bits: int) -> list[str]:
    names = [name for bit, name in THROTTLE_REASON_NAMES.items() if bits & bit]
    unknown = bits & ~sum(THROTTLE_REASON_NAMES)
    if unknown:
        names.append(f"other (0x{unknown:x})")
    return names


# Well-known XID codes (NVIDIA "XID Errors" guide), for log lines and the UI.
XID_DESCRIPTIONS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

_VENDOR_WORDS = {"simulated", "nvidia", "tesla", "geforce", "quadro"}
_PREFIXED = {"RTX", "GTX", "TITAN"}
_SUFFIXES = {"TI", "SUPER", "ADA"}


def gpu_type_from_name(name: str) -> str:
    """Short model name: "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-40GB" -> "A100",
    "NVIDIA GeForce RTX 4090" -> "RTX 4090", "Tesla V100-SXM2-16GB" -> "V100"."""
    words = [w for w in re.split(r"\s+", name.strip()) if w and w.lower() not in _VENDOR_WORDS]
    if not words:
        return name.strip() or "unknown"
    first = words[0]
    if first.upper() in _PREFIXED and len(words) > 1:
        kept = [first.upper(), words[1].split("-")[0]]
        if len(words) > 2 and words[2].upper() in _SUFFIXES:
            kept.append(words[2].capitalize() if words[2].upper() != "SUPER" else "SUPER")
        return " ".join(kept)
    return first.split("-")[0]
