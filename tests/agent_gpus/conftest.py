"""Fixtures for the GPU backend tests: a fake clock, busy/idle child processes, a fake NVML.

The fake NVML replaces pynvml's functions (monkeypatch) and raises the real ``pynvml.NVMLError`` codes, so
the backend's error mapping is tested against the same exception classes a real driver produces.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml
import pytest

BUSY = "while True: pass"
IDLE = "import time; time.sleep(120)"
# A torchrun-like tree: a launcher that sleeps while two busy workers run.
TREE = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2)]\n"
    "time.sleep(120)\n"
)


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def spawn():
    """spawn(code) -> Popen of a Python child; every child (and its group) is killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass(frozen=True)
class Err:
    """A FakeGpu field set to Err(code) makes that NVML call raise the real NVMLError for code."""

    code: int


@dataclass
class FakeGpu:
    """One fake device; set a field to Err(code) to make that call raise NVMLError(code)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total: int = 81559 * 1024 * 1024
    used: int = 1024 * 1024 * 1024
    util: object = (87, 41)  # (gpu, memory)
    temp: object = 64
    power_mw: object = 512_345
    limit_mw: object = 700_000
    sm_clock: object = 1755
    fan: object = Err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    reasons: object = 0x4 | 0x20
    ecc: object = 0
    procs: object = field(default_factory=lambda: [(4242, 2048 * 1024 * 1024)])
    memory_error: Err | None = None
    lost: int | None = None  # every call raises this code (e.g. GPU_IS_LOST)
    calls: dict[str, int] = field(default_factory=dict)


class FakeNvml:
    """Installs fakes for every pynvml function the backend calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.inits = 0
        self.shutdowns = 0
        self.init_error: int | None = None
        self.events: list[SimpleNamespace] = []
        self.registered: list[FakeGpu] = []
        self.event_error: int | None = None  # nvmlEventSetCreate raises this
        self.register_error: int | None = None
        self.waits: list[int] = []
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _get(self, gpu: FakeGpu, what: str, value: object) -> object:
        gpu.calls[what] = gpu.calls.get(what, 0) + 1
        if gpu.lost is not None:
            raise nvml_error(gpu.lost)
        if isinstance(value, Err):
            raise nvml_error(value.code)
        return value

    # -- library -----------------------------------------------------------------------------------------
    def nvmlInit(self):
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    # -- device ------------------------------------------------------------------------------------------
    def nvmlDeviceGetName(self, h):
        return self._get(h, "name", h.name)

    def nvmlDeviceGetUUID(self, h):
        return self._get(h, "uuid", h.uuid)

    def nvmlDeviceGetMemoryInfo(self, h):
        self._get(h, "memory", getattr(h, "memory_error", None))
        return SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetUtilizationRates(self, h):
        value = self._get(h, "util", h.util)
        return SimpleNamespace(gpu=value[0], memory=value[1])

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._get(h, "temp", h.temp)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get(h, "power", h.power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._get(h, "limit", h.limit_mw)

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        assert clock_type == pynvml.NVML_CLOCK_SM
        return self._get(h, "clock", h.sm_clock)

    def nvmlDeviceGetFanSpeed(self, h):
        return self._get(h, "fan", h.fan)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._get(h, "reasons", h.reasons)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._get(h, "throttle_reasons", h.reasons)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        return self._get(h, "ecc", h.ecc)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        procs = self._get(h, "procs", h.procs)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in procs]

    # -- events ------------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        if self.event_error is not None:
            raise nvml_error(self.event_error)
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        assert types == pynvml.nvmlEventTypeXidCriticalError and event_set == "event-set"
        if self.register_error is not None:
            raise nvml_error(self.register_error)
        self.registered.append(h)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        self.waits.append(timeout_ms)
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set):
        pass

    def push_xid(self, gpu: FakeGpu, xid: int) -> None:
        self.events.append(
            SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)
        )


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(*gpus: FakeGpu) -> FakeNvml:
        return FakeNvml(monkeypatch, list(gpus) or [FakeGpu()])

    return install
