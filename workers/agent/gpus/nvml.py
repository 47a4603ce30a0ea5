"""The NVML backend (real GPUs), on nvidia-ml-py's ``pynvml``.

* NVML is initialised once and every device handle is fetched once; after a fork the child re-initialises
  NVML and fetches its handles again before its first call (``os.register_at_fork``).
* Per-process memory (``nvmlDeviceGetComputeRunningProcesses``) is slow and takes the driver lock: it is read
  at most every ``process_refresh_s`` seconds (and right after a job is attached or detached); samples in
  between carry the cached list and its ``processes_ts``.
* A device whose calls fail with GPU_IS_LOST, UNKNOWN, TIMEOUT, RESET_REQUIRED (...) gives a sample with
  ``available=False`` and no metric; no further call is made on it during that sample. Metrics the board
  does not have (fan on passively cooled boards, ECC when disabled, ...) are None, logged once.
* XID events: an event set with ``nvmlEventTypeXidCriticalError`` registered on every device that supports
  it, waited on with ``nvmlEventSetWait_v2``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pynvml

from .base import (
    GpuDevice,
    GpuSample,
    NoGpuBackend,
    ProcessUsage,
    XidEvent,
    gpu_type_from_name,
    throttle_reason_names,
)

MIB = 1024 * 1024

# The device stopped answering: the whole sample is "no data".
LOST_ERRORS = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_TIMEOUT,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_IRQ_ISSUE,
        pynvml.NVML_ERROR_UNINITIALIZED,
    }
)


class _DeviceLost(Exception):
    def __init__(self, error: pynvml.NVMLError) -> None:
        super().__init__(str(error))
        self.error = error


def nvml_error_name(error: BaseException) -> str:
    """'NVMLError_LibraryNotFound: NVML Shared Library Not Found'."""
    try:
        text = str(error)
    except Exception:  # str() of an NVMLError may itself call into a missing library
        text = ""
    name = type(error).__name__
    if isinstance(error, pynvml.NVMLError) and name == "NVMLError":
        name = f"NVMLError {getattr(error, 'value', '?')}"
    return f"{name}: {text}" if text else name


def unavailable_reason(error: BaseException) -> str:
    value = getattr(error, "value", None)
    if value in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
        return "no NVIDIA driver on this host"
    if value == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "the NVIDIA driver and its library differ in version (reload the driver or reboot)"
    if value == pynvml.NVML_ERROR_NO_PERMISSION:
        return "no permission to use the NVIDIA driver"
    return "the NVIDIA driver is not usable"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> Any:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _format_cuda_version(version: int) -> str:
    return f"{version // 1000}.{(version % 1000) // 10}"


class NvmlBackend:
    kind = "nvml"

    def __init__(
        self,
        *,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        process_refresh_s: float = 5.0,
    ) -> None:
        self.log = logger or logging.getLogger("workers.agent.gpus")
        self.clock = clock
        self.monotonic = monotonic
        self.process_refresh_s = process_refresh_s
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()
        self._logged: set[tuple[Any, ...]] = set()
        self._closed = False
        self._needs_reinit = False
        self._handles: list[Any] = []
        self._devices: list[GpuDevice] = []
        self._procs: dict[int, list[ProcessUsage]] = {}
        self._procs_ts: float | None = None
        self._procs_mono = -float("inf")
        self._jobs: dict[int, dict[int, tuple[int, int | None]]] = {}
        self._event_set: Any = None
        self._event_handles: dict[Any, int] = {}
        self._events_supported = True
        self._old_throttle_api = False
        self._lost: set[int] = set()
        pynvml.nvmlInit()  # raises pynvml.NVMLError: open_backend turns that into NoGpuBackend
        try:
            self._load_devices()
        except BaseException:
            self._shutdown_quietly()
            raise
        ref = weakref.ref(self)

        def after_fork_in_child() -> None:  # no NVML call here: the child re-initialises on first use
            backend = ref()
            if backend is not None:
                backend._needs_reinit = True
                # Another thread of the parent may have held these at the fork: the child gets fresh ones.
                backend._lock = threading.RLock()
                backend._poll_lock = threading.Lock()

        os.register_at_fork(after_in_child=after_fork_in_child)

    # -- setup -------------------------------------------------------------------------------------------

    def _load_devices(self) -> None:
        count = pynvml.nvmlDeviceGetCount()
        handles: list[Any] = []
        devices: list[GpuDevice] = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = _text(pynvml.nvmlDeviceGetName(handle))
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                memory_mb = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB)
            except pynvml.NVMLError as exc:
                # A GPU broken at start-up cannot be identified: leave it out, say so loudly.
                self.log.error("GPU %d left out: NVML cannot read it (%s)", index, nvml_error_name(exc))
                continue
            handles.append(handle)
            devices.append(GpuDevice(index, uuid, name, gpu_type_from_name(name), memory_mb))
        if not devices:
            if count:
                raise NoGpuBackend(
                    f"NVML found {count} GPU(s) but none answers", reason="all GPUs unreadable"
                )
            raise NoGpuBackend("NVML found no GPU on this host", reason="no GPU")
        if self._devices and [d.uuid for d in devices] != [d.uuid for d in self._devices]:
            self.log.warning("GPU list changed on NVML re-initialisation: %s", [d.uuid for d in devices])
        self._handles = handles
        self._devices = devices

    def _reinit_after_fork(self) -> None:
        self.log.info("re-initialising NVML in forked process %d", os.getpid())
        self._needs_reinit = False
        self._event_set = None  # the parent's event set is not ours to use or free
        self._event_handles = {}
        pynvml.nvmlInit()
        self._load_devices()

    def _ready(self) -> None:
        if self._closed:
            raise RuntimeError("NVML backend is closed")
        if self._needs_reinit:
            with self._lock:
                if self._needs_reinit:
                    self._reinit_after_fork()

    def _log_once(self, key: tuple[Any, ...], level: int, msg: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            self.log.log(level, msg, *args)

    # -- interface ---------------------------------------------------------------------------------------

    def devices(self) -> list[GpuDevice]:
        self._ready()
        return list(self._devices)

    def driver_info(self) -> dict[str, str]:
        self._ready()
        info = {"driver_version": "unknown", "cuda_version": "unknown"}
        try:
            info["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            self._log_once(("driver_version",), logging.WARNING, "driver version unreadable: %s", exc)
        try:
            info["cuda_version"] = _format_cuda_version(int(pynvml.nvmlSystemGetCudaDriverVersion_v2()))
        except pynvml.NVMLError as exc:
            self._log_once(("cuda_version",), logging.WARNING, "CUDA driver version unreadable: %s", exc)
        return info

    def attach_job(self, index: int, job_id: int, pid: int, memory_limit_mb: int | None = None) -> None:
        with self._lock:
            self._jobs.setdefault(index, {})[job_id] = (int(pid), memory_limit_mb)
            self._procs_mono = -float("inf")  # show the new process at the next sample

    def detach_job(self, index: int, job_id: int) -> None:
        with self._lock:
            if self._jobs.get(index, {}).pop(job_id, None) is not None:
                self._procs_mono = -float("inf")

    def attached(self, index: int) -> dict[int, int]:
        """{job_id: pid} the agent attached to GPU ``index``."""
        with self._lock:
            return {job: pid for job, (pid, _) in self._jobs.get(index, {}).items()}

    def sample(self) -> list[GpuSample]:
        self._ready()
        with self._lock:
            refresh_procs = self.monotonic() - self._procs_mono >= self.process_refresh_s
            if refresh_procs:
                self._procs_mono = self.monotonic()
                self._procs_ts = self.clock()
            return [
                self._sample_one(d, h, refresh_procs)
                for d, h in zip(self._devices, self._handles, strict=True)
            ]

    def poll_xid_events(self, timeout_ms: int) -> list[XidEvent]:
        """XID events, waiting up to timeout_ms for the first; [] at once after close()."""
        if self._closed:
            return []
        self._ready()
        with self._poll_lock:  # close() frees the event set only when no wait is in progress
            if self._closed:
                return []
            event_set = self._ensure_event_set()
            if event_set is None:
                time.sleep(max(0, timeout_ms) / 1000)  # callers loop on this: keep it a real wait
                return []
            return self._wait_events(event_set, max(0, int(timeout_ms)))

    def _wait_events(self, event_set: Any, wait_ms: int) -> list[XidEvent]:
        events: list[XidEvent] = []
        while len(events) < 64:
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, wait_ms)
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) != pynvml.NVML_ERROR_TIMEOUT:
                    self._log_once(
                        ("event_wait", getattr(exc, "value", None)),
                        logging.WARNING,
                        "waiting for XID events failed: %s",
                        nvml_error_name(exc),
                    )
                    if not events:
                        time.sleep(min(wait_ms, 1000) / 1000)
                break
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                index = self._event_handles.get(_handle_key(data.device), -1)
                uuid = next((d.uuid for d in self._devices if d.index == index), "")
                events.append(XidEvent(index, uuid, int(data.eventData), self.clock()))
            wait_ms = 0  # drain what is already queued, without waiting again
        return events

    def close(self) -> None:
        """Shut NVML down; waits for an XID wait in progress in another thread (at most its timeout)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self._poll_lock, self._lock:
            if self._event_set is not None and not self._needs_reinit:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
            self._shutdown_quietly()

    # -- internals ---------------------------------------------------------------------------------------

    def _shutdown_quietly(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def _ensure_event_set(self) -> Any:
        with self._lock:
            if self._event_set is not None or not self._events_supported:
                return self._event_set
            try:
                event_set = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as exc:
                self._events_supported = False
                self._log_once(
                    ("events",),
                    logging.WARNING,
                    "XID events unavailable (%s): no XID reporting",
                    nvml_error_name(exc),
                )
                return None
            registered: dict[Any, int] = {}
            for device, handle in zip(self._devices, self._handles, strict=True):
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                    registered[_handle_key(handle)] = device.index
                except pynvml.NVMLError as exc:
                    self._log_once(
                        ("events", device.index),
                        logging.WARNING,
                        "GPU %d: XID events unavailable (%s)",
                        device.index,
                        nvml_error_name(exc),
                    )
            if not registered:
                self._events_supported = False
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(event_set)
                return None
            self._event_set, self._event_handles = event_set, registered
            return event_set

    def _call(self, device: GpuDevice, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args); None if the board lacks it; raises _DeviceLost if the GPU stopped answering."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            value = getattr(exc, "value", None)
            if value in LOST_ERRORS:
                raise _DeviceLost(exc) from exc
            level = logging.DEBUG if value == pynvml.NVML_ERROR_NOT_SUPPORTED else logging.WARNING
            self._log_once(
                (device.index, field, value),
                level,
                "GPU %d: %s unavailable (%s)",
                device.index,
                field,
                nvml_error_name(exc),
            )
            return None

    def _throttle_bits(self, device: GpuDevice, handle: Any) -> int | None:
        getter = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is not None and not self._old_throttle_api:
            try:
                bits: int = getter(handle)
                return bits
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    return self._call(device, "clock event reasons", _reraise, exc)
                self._old_throttle_api = True  # drivers before 535 only have the older name
        return self._call(
            device, "clock event reasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle
        )

    def _sample_one(self, device: GpuDevice, handle: Any, refresh_procs: bool) -> GpuSample:
        ts = self.clock()
        call = self._call
        try:
            util = call(device, "utilization", pynvml.nvmlDeviceGetUtilizationRates, handle)
            mem = call(device, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
            temp = call(
                device, "temperature", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
            )
            power_mw = call(device, "power", pynvml.nvmlDeviceGetPowerUsage, handle)
            limit_mw = call(device, "power limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            sm_clock = call(device, "SM clock", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            fan = call(device, "fan speed", pynvml.nvmlDeviceGetFanSpeed, handle)
            bits = self._throttle_bits(device, handle)
            ecc = call(
                device,
                "ECC errors",
                pynvml.nvmlDeviceGetTotalEccErrors,
                handle,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            if refresh_procs:
                procs = call(device, "processes", pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
                self._procs[device.index] = [
                    ProcessUsage(
                        int(p.pid), int(p.usedGpuMemory // MIB) if p.usedGpuMemory is not None else None
                    )
                    for p in (procs or [])
                ]
        except _DeviceLost as lost:
            if device.index not in self._lost:
                self._lost.add(device.index)
                self.log.error(
                    "GPU %d (%s) stopped answering: %s",
                    device.index,
                    device.uuid,
                    nvml_error_name(lost.error),
                )
            return GpuSample(device.index, device.uuid, ts, available=False, error=str(lost.error))
        if device.index in self._lost:
            self._lost.discard(device.index)
            self.log.warning("GPU %d (%s) answers again", device.index, device.uuid)
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            ts=ts,
            available=True,
            utilization_pct=float(util.gpu) if util is not None else None,
            memory_used_mb=int(mem.used // MIB) if mem is not None else None,
            memory_total_mb=int(mem.total // MIB) if mem is not None else device.memory_mb,
            memory_bandwidth_pct=float(util.memory) if util is not None else None,
            temperature_c=int(temp) if temp is not None else None,
            power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
            power_limit_w=round(limit_mw / 1000.0, 1) if limit_mw is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            fan_pct=int(fan) if fan is not None else None,
            throttle_reasons=throttle_reason_names(int(bits)) if bits is not None else [],
            ecc_errors_volatile=int(ecc) if ecc is not None else None,
            processes=list(self._procs.get(device.index, [])),
            processes_ts=self._procs_ts,
        )


def _reraise(exc: BaseException) -> Any:
    raise exc
