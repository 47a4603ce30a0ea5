"""Simulated GPUs: run the whole console on machines without GPUs.

The model is driven by what really runs on the host. The agent attaches each job's process to the GPUs it
was given; the simulated GPU then shows:

* SM utilization from the CPU use of the job's process tree (root, its children, orphans of its process
  group): one busy core ~ 96 %, half a core ~ 81 %, an idle (sleeping) process
  ~ 0-3 %, nothing attached 0 %. A job attached to
  several GPUs through the same pid has its CPU use split between them.
* memory used: a CUDA context (~500 MB) plus the RSS of the tree (times ``memory_scale``), capped at the GPU's
  memory (not at the job's declared limit: the agent's watch enforces that, as it must on a real GPU). Processes: one entry per attached, live root pid.
* power = idle + (TDP - idle) x utilization; temperature follows power with a first-order lag
  (time constant ``thermal_tau_s``, ambient 30 C, ~75 C at TDP); the SM clock drops when hot and to the idle
  clock when nothing runs; clock-event reasons follow (GPU idle, SW power cap, thermal slowdowns).

Faults, for tests and demos: ``inject(index, "overheat" | "stuck" | "xid" | "xid:<code>")`` and
``clear(index)``, or a JSON file (``fault_file``) that is re-read whenever it changes, e.g.
``{"0": "overheat", "3": ["stuck"], "5": "xid:48", "1": "clear"}``.

* overheat: a cooling failure; the temperature passes 90 C within ~3 s and stays until cleared, with thermal
  slowdown reasons and a halved SM clock; after ``clear`` it cools down with the normal lag.
* stuck: the GPU stops answering; samples have ``available=False`` until cleared.
* xid: one XidEvent (default code 79). Xid 79 ("GPU has fallen off the bus") also makes the GPU stop
  answering until cleared, as on real hardware; ECC xids (48, 94, 95) bump the volatile ECC counter.
  From the file, an xid fires when the entry appears or changes (write another value or "clear" to re-arm).

Time: ``clock`` (default ``time.time``) drives the thermal model and the timestamps, so tests can advance a
fake clock instead of sleeping. CPU use is always measured in real (monotonic) time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .base import (
    XID_DESCRIPTIONS,
    GpuDevice,
    GpuSample,
    ProcessUsage,
    XidEvent,
    gpu_type_from_name,
)
from .procstat import ProcessTreeMeter, TreeUsage

_UUID_NAMESPACE = uuidlib.UUID("6f1c2a4e-9b1d-4c55-8a53-5d0c1e0b7a11")

AMBIENT_C = 30.0
FULL_LOAD_RISE_C = 45.0  # at TDP the steady-state temperature is ambient + 45 = 75 C
OVERHEAT_TARGET_C = 98.0
OVERHEAT_TAU_S = 1.0
CONTEXT_MB = 500
# utilization = 100 x (1 - exp(-cores / CORE_SCALE)): 1 busy core ~ 96 %, half a core ~ 81 %, 0.1 core ~ 28 %
CORE_SCALE = 0.3
XID_LOST = {79}  # the GPU is gone after these
XID_ECC = {48, 94, 95}
FAULTS = ("overheat", "stuck", "xid")


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str  # as NVML would report it, without the "Simulated " prefix
    memory_mb: int
    tdp_w: float
    idle_w: float
    max_sm_mhz: int
    idle_sm_mhz: int
    has_fan: bool = False
    ecc: bool = True


GPU_MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("H200", "NVIDIA H200", 143771, 700, 75, 1980, 345),
        GpuModel("H100", "NVIDIA H100 80GB HBM3", 81559, 700, 70, 1980, 345),
        GpuModel("A100", "NVIDIA A100-SXM4-80GB", 81920, 400, 55, 1410, 210),
        GpuModel("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 400, 55, 1410, 210),
        GpuModel("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 400, 50, 1410, 210),
        GpuModel("L40S", "NVIDIA L40S", 46068, 350, 35, 2520, 210),
        GpuModel("RTX 4090", "NVIDIA GeForce RTX 4090", 24564, 450, 25, 2520, 210, has_fan=True, ecc=False),
    )
}
DEFAULT_MEMORY_MB = 24576

_SPEC_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*([A-Za-z][A-Za-z0-9 _.-]*?)\s*$")


def _canonical_type(raw: str) -> str:
    token = re.sub(r"[\s_]+", " ", raw.strip())
    upper = token.upper()
    for key in GPU_MODELS:
        if upper == key.upper() or upper.replace(" ", "") == key.upper().replace(" ", ""):
            return key
    return upper


def model_for(gpu_type: str) -> GpuModel:
    key = _canonical_type(gpu_type)
    if key in GPU_MODELS:
        return GPU_MODELS[key]
    return GpuModel(key, f"NVIDIA {key}", DEFAULT_MEMORY_MB, 300, 30, 1800, 210)


def parse_spec(spec: str) -> tuple[int, GpuModel]:
    """ "4xH200", "2xA100-80GB", "8x H100", "1x RTX 4090" -> (count, model). ValueError if malformed."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("empty GPU simulation spec; expected COUNTxTYPE, e.g. 4xH200")
    m = _SPEC_RE.match(spec)
    if not m:
        raise ValueError(
            f"invalid GPU simulation spec {spec!r}: expected COUNTxTYPE, e.g. 4xH200, 2xA100-80GB, 8x H100"
        )
    count = int(m.group(1))
    if not 1 <= count <= 64:
        raise ValueError(f"invalid GPU simulation spec {spec!r}: the count must be between 1 and 64")
    return count, model_for(m.group(2))


def simulated_uuid(host_name: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{host_name}/{index}')}"


@dataclass
class _Attachment:
    job_id: int
    pid: int
    memory_limit_mb: int | None


@dataclass
class _GpuState:
    device: GpuDevice
    model: GpuModel
    temp_c: float
    last_t: float | None = None
    jobs: dict[int, _Attachment] = field(default_factory=dict)
    api_faults: set[str] = field(default_factory=set)  # "overheat", "stuck"
    file_faults: set[str] = field(default_factory=set)
    lost: bool = False  # after xid 79, until clear
    ecc_volatile: int = 0

    def faults(self) -> set[str]:
        return self.api_faults | self.file_faults | ({"stuck"} if self.lost else set())


def _parse_fault(value: object) -> tuple[str, int | None]:
    """ "overheat" / "stuck" / "clear" / "xid" / "xid:48" / {"fault": "xid", "code": 48} -> (fault, code)."""
    if isinstance(value, dict):
        fault, code = str(value.get("fault", "")).strip().lower(), value.get("code")
        return fault, int(code) if code is not None else None
    text = str(value).strip().lower()
    if text.startswith("xid"):
        rest = text[3:].lstrip(":= ")
        return "xid", int(rest) if rest else None
    return text, None


class SimulatedBackend:
    kind = "simulated"

    def __init__(
        self,
        spec: str = "4xH200",
        *,
        host_name: str | None = None,
        fault_file: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.time,
        thermal_tau_s: float = 25.0,
        memory_scale: float = 1.0,
        logger: logging.Logger | None = None,
        meter: ProcessTreeMeter | None = None,
    ) -> None:
        count, model = parse_spec(spec)
        self.spec = spec
        self.host_name = host_name or socket.gethostname()
        self.fault_file = os.fspath(fault_file) if fault_file is not None else None
        self.clock = clock
        self.thermal_tau_s = thermal_tau_s
        self.memory_scale = memory_scale
        self.log = logger or logging.getLogger("workers.agent.gpus")
        self._meter = meter or ProcessTreeMeter()
        self._lock = threading.Condition()
        self._file_lock = threading.Lock()
        self._events: deque[XidEvent] = deque(maxlen=1000)
        self._file_sig: tuple[int, int, int] | None = None
        self._file_entries: dict[int, set[str]] = {}
        self._closed = False
        idle_temp = AMBIENT_C + FULL_LOAD_RISE_C * model.idle_w / model.tdp_w
        self._gpus = [
            _GpuState(
                device=GpuDevice(
                    index=i,
                    uuid=simulated_uuid(self.host_name, i),
                    name=f"Simulated {model.name}",
                    gpu_type=gpu_type_from_name(model.name),
                    memory_mb=model.memory_mb,
                ),
                model=model,
                temp_c=idle_temp,
            )
            for i in range(count)
        ]
        self.log.info("simulated GPUs: %d x %s (%s) on %s", count, model.name, self.kind, self.host_name)

    # -- interface ---------------------------------------------------------------------------------------

    def devices(self) -> list[GpuDevice]:
        return [g.device for g in self._gpus]

    def driver_info(self) -> dict[str, str]:
        return {"driver_version": "simulated", "cuda_version": "simulated"}

    def attach_job(self, index: int, job_id: int, pid: int, memory_limit_mb: int | None = None) -> None:
        gpu = self._gpu(index)
        with self._lock:
            gpu.jobs[job_id] = _Attachment(job_id, int(pid), memory_limit_mb)

    def detach_job(self, index: int, job_id: int) -> None:
        gpu = self._gpu(index)
        with self._lock:
            gpu.jobs.pop(job_id, None)

    def sample(self) -> list[GpuSample]:
        self._check_fault_file()
        with self._lock:
            now = self.clock()
            roots = [a.pid for g in self._gpus for a in g.jobs.values()]
            usage = self._meter.measure(roots)
            shares: dict[int, int] = {}
            for pid in roots:
                shares[pid] = shares.get(pid, 0) + 1
            return [self._sample_one(g, now, usage, shares) for g in self._gpus]

    def poll_xid_events(self, timeout_ms: int) -> list[XidEvent]:
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            self._check_fault_file()
            with self._lock:
                if self._events or self._closed:
                    events = list(self._events)
                    self._events.clear()
                    return events
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                # Wake up now and then to look at the fault file (another process may write an xid there).
                self._lock.wait(min(left, 0.25))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    # -- fault injection ---------------------------------------------------------------------------------

    def inject(self, index: int, fault: str, code: int | None = None) -> None:
        name, parsed_code = _parse_fault(fault)
        code = code if code is not None else parsed_code
        if name not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
        gpu = self._gpu(index)
        with self._lock:
            if name == "xid":
                self._emit_xid(gpu, 79 if code is None else code)
            else:
                gpu.api_faults.add(name)
            self.log.warning("simulated GPU %d: injected fault %s", index, fault)

    def clear(self, index: int) -> None:
        gpu = self._gpu(index)
        with self._lock:
            gpu.api_faults.clear()
            gpu.file_faults.clear()
            gpu.lost = False
            self.log.info("simulated GPU %d: faults cleared", index)

    def faults(self, index: int) -> set[str]:
        with self._lock:
            return self._gpu(index).faults()

    # -- internals ---------------------------------------------------------------------------------------

    def _gpu(self, index: int) -> _GpuState:
        if not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise ValueError(f"no simulated GPU {index!r}: this host has GPUs 0..{len(self._gpus) - 1}")
        return self._gpus[index]

    def _emit_xid(self, gpu: _GpuState, code: int) -> None:
        self._events.append(XidEvent(gpu.device.index, gpu.device.uuid, int(code), self.clock()))
        if code in XID_LOST:
            gpu.lost = True
        if code in XID_ECC:
            gpu.ecc_volatile += 1
        self.log.warning(
            "simulated GPU %d: xid %d (%s)", gpu.device.index, code, XID_DESCRIPTIONS.get(code, "unknown")
        )
        self._lock.notify_all()

    def _sample_one(self, gpu: _GpuState, now: float, usage: dict[int, TreeUsage], shares: dict[int, int]) -> GpuSample:
        model = gpu.model
        util = 0.0
        used_mb = 0
        processes: list[ProcessUsage] = []
        for job in gpu.jobs.values():
            tree = usage.get(job.pid)
            if tree is None or not tree.alive:
                continue
            share = shares.get(job.pid, 1)
            cores = tree.cpu_cores / share
            util += 100.0 * (1.0 - math.exp(-cores / CORE_SCALE))
            # Not capped at the job's limit: as on a real GPU without MPS, a job may go past its share, and the
            # agent's watch has to notice and stop it.
            mem = min(CONTEXT_MB + int(tree.rss_mb * self.memory_scale / share), model.memory_mb)
            used_mb += mem
            # The root pid, or (launcher gone, workers still running) the first orphan of its process group.
            processes.append(ProcessUsage(job.pid if job.pid in tree.pids else tree.pids[0], mem))
        if util > 2.0:  # a live GPU never reads perfectly flat
            util *= 1.0 + 0.03 * math.sin(now / 7.0 + gpu.device.index)
        util = max(0.0, min(100.0, util))
        used_mb = min(used_mb, model.memory_mb)

        power = model.idle_w + (model.tdp_w - model.idle_w) * util / 100.0
        faults = gpu.faults()
        target = AMBIENT_C + FULL_LOAD_RISE_C * power / model.tdp_w
        tau = self.thermal_tau_s
        if "overheat" in faults:
            target, tau = max(target, OVERHEAT_TARGET_C), OVERHEAT_TAU_S
        if gpu.last_t is not None and now > gpu.last_t:
            gpu.temp_c = target + (gpu.temp_c - target) * math.exp(-(now - gpu.last_t) / tau)
        gpu.last_t = now

        if "stuck" in faults:
            return GpuSample(
                index=gpu.device.index,
                uuid=gpu.device.uuid,
                ts=now,
                available=False,
                error="GPU is lost" if gpu.lost else "GPU not responding (simulated stuck fault)",
            )

        temp = gpu.temp_c
        reasons: list[str] = []
        if not processes and util < 1.0:
            clock_mhz = float(model.idle_sm_mhz)
            reasons.append("GPU idle")
        else:
            clock_mhz = model.max_sm_mhz * (1.0 - 0.01 * max(0.0, min(temp, 85.0) - 70.0))
            if power >= 0.97 * model.tdp_w:
                reasons.append("SW power cap")
            if temp >= 87.0:
                reasons.append("SW thermal slowdown")
        if temp >= 90.0:
            clock_mhz = min(clock_mhz, model.max_sm_mhz * 0.5)
            reasons.append("HW thermal slowdown")
        fan = None
        if model.has_fan:
            fan = int(max(30.0, min(100.0, 30.0 + (temp - 40.0) * 2.0)))
        return GpuSample(
            index=gpu.device.index,
            uuid=gpu.device.uuid,
            ts=now,
            available=True,
            utilization_pct=round(util, 1),
            memory_used_mb=used_mb,
            memory_total_mb=model.memory_mb,
            memory_bandwidth_pct=round(util * 0.55, 1),
            temperature_c=int(round(temp)),
            power_w=round(power, 1),
            power_limit_w=float(model.tdp_w),
            sm_clock_mhz=int(round(clock_mhz)),
            fan_pct=fan,
            throttle_reasons=reasons,
            ecc_errors_volatile=gpu.ecc_volatile if model.ecc else None,
            processes=processes,
            processes_ts=now,
        )

    def _check_fault_file(self) -> None:
        if self.fault_file is None:
            return
        with self._file_lock:  # the sampler and the XID poller both look, from different threads
            self._reload_fault_file()

    def _reload_fault_file(self) -> None:
        assert self.fault_file is not None
        try:
            st = os.stat(self.fault_file)
            sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            sig = None
        except OSError as exc:
            self.log.warning("fault file %s unreadable: %s", self.fault_file, exc)
            return
        if sig == self._file_sig:
            return
        entries: dict[int, set[str]] = {}
        clears: set[int] = set()
        if sig is not None:
            try:
                with open(self.fault_file, encoding="utf-8") as f:
                    text = f.read()
                data = json.loads(text) if text.strip() else {}
                if not isinstance(data, dict):
                    raise ValueError('expected a JSON object like {"0": "overheat"}')
                for key, raw in data.items():
                    index = int(key)
                    self._gpu(index)
                    values = raw if isinstance(raw, list) else [raw]
                    for value in values:
                        if value is None:
                            continue
                        name, code = _parse_fault(value)
                        if name in ("clear", "none", ""):
                            clears.add(index)
                        elif name == "xid":
                            entries.setdefault(index, set()).add(f"xid:{79 if code is None else code}")
                        elif name in FAULTS:
                            entries.setdefault(index, set()).add(name)
                        else:
                            raise ValueError(f"unknown fault {value!r} for GPU {key}")
            except (OSError, ValueError, TypeError) as exc:
                # A half-written file is retried when it changes again; faults stay as they were meanwhile.
                self.log.warning("fault file %s ignored: %s", self.fault_file, exc)
                self._file_sig = sig
                return
        self._file_sig = sig
        with self._lock:
            for gpu in self._gpus:
                i = gpu.device.index
                if i in clears:
                    gpu.api_faults.clear()
                    gpu.lost = False
                new = entries.get(i, set())
                gpu.file_faults = {f for f in new if not f.startswith("xid:")}
                for token in sorted(new - self._file_entries.get(i, set())):
                    if token.startswith("xid:"):
                        self._emit_xid(gpu, int(token[4:]))
            self._file_entries = entries
            if entries or clears:
                self.log.info(
                    "fault file %s: %s", self.fault_file, {k: sorted(v) for k, v in entries.items()}
                )
