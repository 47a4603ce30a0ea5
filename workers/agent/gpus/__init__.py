"""GPU backends for the host agent: real GPUs through NVML, or simulated GPUs driven by the real jobs.

backend = open_backend(None)                  # NVML; NoGpuBackend if there is no usable driver
backend = open_backend("4xH200")              # simulated (also "2xA100-80GB", "8x H100")
backend = open_backend(None, fallback_simulate="4xH200")   # NVML, else simulated with a warning
"""

from __future__ import annotations

import logging
import os

from .base import (
    NO_DRIVER_HINT,
    THROTTLE_REASON_NAMES,
    XID_DESCRIPTIONS,
    GpuBackend,
    GpuDevice,
    GpuSample,
    NoGpuBackend,
    ProcessUsage,
    XidEvent,
    gpu_type_from_name,
    throttle_reason_names,
)
from .simulated import GPU_MODELS, SimulatedBackend, parse_spec

__all__ = [
    "GPU_MODELS",
    "NO_DRIVER_HINT",
    "THROTTLE_REASON_NAMES",
    "XID_DESCRIPTIONS",
    "GpuBackend",
    "GpuDevice",
    "GpuSample",
    "NoGpuBackend",
    "ProcessUsage",
    "SimulatedBackend",
    "XidEvent",
    "gpu_type_from_name",
    "open_backend",
    "parse_spec",
    "throttle_reason_names",
]


def open_backend(
    simulate: str | None = None,
    *,
    logger: logging.Logger | None = None,
    fallback_simulate: str | None = None,
    host_name: str | None = None,
    fault_file: str | os.PathLike[str] | None = None,
) -> GpuBackend:
    """The GPU backend for this host.

    ``simulate`` ("4xH200"): simulated GPUs (ValueError if the spec is malformed). Otherwise NVML; when NVML
    cannot start, the reason is logged and NoGpuBackend raised, or with ``fallback_simulate`` the simulated
    backend is returned after a warning. ``host_name`` and ``fault_file`` go to the simulated backend.
    """
    log = logger or logging.getLogger("workers.agent.gpus")
    if fallback_simulate is not None:
        parse_spec(
            fallback_simulate
        )  # a bad fallback is a configuration error: say so now, not on a GPU-less day
    if simulate:
        return SimulatedBackend(simulate, host_name=host_name, fault_file=fault_file, logger=log)
    try:
        import pynvml

        from .nvml import NvmlBackend, nvml_error_name, unavailable_reason
    except ImportError as exc:
        message = f"NVML unavailable ({exc}): nvidia-ml-py is not installed; {NO_DRIVER_HINT}"
        error: NoGpuBackend = NoGpuBackend(message, reason="nvidia-ml-py missing", cause=exc)
    else:
        try:
            backend = NvmlBackend(logger=log)
            if fault_file is not None:
                log.warning(
                    "fault file %s ignored: fault injection needs simulated GPUs (--simulate)", fault_file
                )
            return backend
        except pynvml.NVMLError as exc:
            message = (
                f"NVML unavailable ({nvml_error_name(exc)}): {unavailable_reason(exc)}; {NO_DRIVER_HINT}"
            )
            error = NoGpuBackend(message, reason=unavailable_reason(exc), cause=exc)
        except NoGpuBackend as exc:
            error = NoGpuBackend(f"{exc}; {NO_DRIVER_HINT}", reason=exc.reason, cause=exc)
    if fallback_simulate is not None:
        log.warning("%s; falling back to simulated GPUs: %s", error, fallback_simulate)
        return SimulatedBackend(fallback_simulate, host_name=host_name, fault_file=fault_file, logger=log)
    log.error("%s", error)
    raise error from error.cause
