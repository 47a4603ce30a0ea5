"""Per-job cgroups: memory, CPU and process-count limits, and (cgroup v1) the job's GPU device nodes only.

Every job attempt runs in a cgroup of its own, `<parent>/<host>/job-<id>-<attempt>`, made before its shim starts.
The shim's forked child joins it (writes its own pid into each `cgroup.procs`) before it drops privileges and
execs the job, so everything the job starts is inside and the shim, its supervisor, stays outside: the OOM killer
picks among the job's processes only.

Two layouts, chosen at run time:
- cgroup v2 (`/sys/fs/cgroup/cgroup.controllers`): one tree; `memory.max`, `memory.swap.max`, `cpu.max`,
  `pids.max`; OOM kills counted in `memory.events`. Controllers are enabled in each ancestor's
  `cgroup.subtree_control`, and no process may sit in an inner node, so the parent sits at the root of the
  hierarchy (as Docker's cgroupfs driver does), not under the agent's own cgroup (which holds the agent).
- cgroup v1 (controllers mounted at `/sys/fs/cgroup/<controller>`, possibly beside an empty v2 tree at
  `unified`: the "hybrid" layout): a directory per controller, nested under the agent's own cgroup in that
  controller (so what bounds the agent's service bounds its jobs too).
Where neither is writable (an agent not run as root), jobs run without these limits, and the running report's
`runtime_info.limits` says why.

No Django here: the agent imports this on GPU hosts.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import signal
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.protocol import Dispatch

logger = logging.getLogger("workers.agent")

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
DEFAULT_PARENT = "gpu-agent"
DEFAULT_PIDS_MAX = 4096
CFS_PERIOD_US = 100_000
CFS_MIN_QUOTA_US = 1_000  # the kernel's floor for cpu.cfs_quota_us / cpu.max
V1_CONTROLLERS = ("memory", "cpu", "pids", "devices")
V2_CONTROLLERS = ("memory", "cpu", "pids")
NVIDIA_MAJOR = 195
REMOVE_ATTEMPTS = 20
GIB = 1024**3


@dataclass(frozen=True)
class Limits:
    """What a job may use on this host; None: no limit of that kind."""

    cpus: float | None = None
    memory_bytes: int | None = None
    pids: int | None = DEFAULT_PIDS_MAX

    @classmethod
    def of(cls, cpus: float | None, memory_gb: float | None, pids: int | None = None) -> Limits:
        return cls(cpus=cpus if cpus and cpus > 0 else None,
                   memory_bytes=int(memory_gb * GIB) if memory_gb and memory_gb > 0 else None,
                   pids=pids if pids is not None else pids_max_from_env())

    def describe(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory_gb": None if self.memory_bytes is None else round(self.memory_bytes / GIB, 3),
                "pids": self.pids}


def pids_max_from_env() -> int:
    value = os.environ.get("GPU_AGENT_JOB_PIDS_MAX", "").strip()
    if not value:
        return DEFAULT_PIDS_MAX
    try:
        number = int(value)
    except ValueError:
        raise SystemExit(f"gpu-agent: GPU_AGENT_JOB_PIDS_MAX={value!r}: expected a whole number > 0") from None
    if number <= 0:
        raise SystemExit(f"gpu-agent: GPU_AGENT_JOB_PIDS_MAX={value!r}: expected a whole number > 0")
    return number


def format_gb(memory_bytes: int) -> str:
    return f"{memory_bytes / GIB:.4g} GB"


def cfs_quota_us(cpus: float, period_us: int = CFS_PERIOD_US) -> int:
    """CPU time per period for `cpus` CPUs (fractional allowed), at least the kernel's floor."""
    return max(CFS_MIN_QUOTA_US, math.ceil(cpus * period_us))


def host_capacity() -> tuple[int, int]:
    """(CPUs this agent may use, memory MiB) of this host: what it registers, so the console refuses a job
    that asks more than any host has."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return cpus, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)


# --- layout


@dataclass(frozen=True)
class Layout:
    """Which cgroup hierarchy this host has, and where each of our controllers is."""

    version: str  # "v2" | "v1" | "none"
    root: Path
    # v1: controller -> its mount; v2: {"unified": root}
    mounts: dict[str, Path] = field(default_factory=dict)
    reason: str = ""  # why "none"


def detect(root: Path = CGROUP_ROOT) -> Layout:
    """The cgroup layout of this host: pure v2, v1 (also the hybrid layout with an empty v2 tree), or none."""
    if (root / "cgroup.controllers").is_file():
        available = set((root / "cgroup.controllers").read_text().split())
        missing = [name for name in ("memory", "pids") if name not in available]
        if missing:
            return Layout("none", root, reason=f"cgroup v2 at {root} lacks the {', '.join(missing)} controller")
        return Layout("v2", root, {"unified": root})
    mounts = {name: root / name for name in V1_CONTROLLERS if (root / name / "cgroup.procs").is_file()}
    if "memory" in mounts and "pids" in mounts:
        return Layout("v1", root, mounts)
    return Layout("none", root, reason=f"no cgroup v2 tree nor v1 memory and pids controllers under {root}")


def own_cgroups(proc_file: Path = PROC_SELF_CGROUP) -> dict[str, str]:
    """This process's cgroup per v1 controller, and "" -> its v2 cgroup (from /proc/self/cgroup)."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in proc_file.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(","):
                paths[name] = path
    return paths


# --- the agent's part of the tree


class CgroupSupport:
    """The agent's cgroups: where job cgroups go, or why there are none. Made once per agent."""

    def __init__(self, layout: Layout | None = None, *, parent: str | None = None,
                 proc_file: Path = PROC_SELF_CGROUP, dev_dir: Path = Path("/dev"), simulated: bool = False) -> None:
        self.layout = layout or detect()
        self.simulated = simulated  # simulated GPUs have no device nodes to keep apart
        self.parent = (parent if parent is not None else os.environ.get("GPU_AGENT_CGROUP_PARENT") or
                       DEFAULT_PARENT).strip("/")
        self.dev_dir = dev_dir
        self._own = own_cgroups(proc_file)
        self._hosts: dict[str, str] = {}  # host -> "" (ready) or why its jobs get no cgroup
        self.reason = self.layout.reason
        if os.environ.get("GPU_AGENT_CGROUPS", "").strip().lower() in {"0", "off", "no", "false"}:
            self.reason = "turned off on this agent (GPU_AGENT_CGROUPS=off)"
        elif not self.reason:
            base = next(iter(self.host_dirs("probe").values())).parent
            writable = next((folder for folder in [base, *base.parents] if folder.exists()), None)
            if writable is None or not os.access(writable, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
                self.reason = (f"{self.layout.version} cgroups at {writable} are not writable by this agent "
                               f"(uid {os.geteuid()}); run the agent as root")
        if self.reason:
            logger.warning("job limits are off: %s; jobs run without memory, CPU and process-count limits",
                           self.reason)

    @property
    def enabled(self) -> bool:
        return not self.reason

    def host_dirs(self, host: str) -> dict[str, Path]:
        """controller -> the agent's folder for this host's jobs."""
        name = _safe_name(host)
        if self.layout.version == "v2":
            return {"unified": self.layout.root / self.parent / name}
        return {controller: mount / self._own.get(controller, "/").lstrip("/") / self.parent / name
                for controller, mount in self.layout.mounts.items()}

    def off_reason(self, host: str) -> str:
        """Why jobs for this host get no cgroup ("" when they do): the host's folders are made on first use."""
        if self.reason:
            return self.reason
        if host not in self._hosts:
            try:
                for folder in self.host_dirs(host).values():
                    if self.layout.version == "v2":
                        _enable_v2_controllers(self.layout.root, folder)
                    else:
                        folder.mkdir(parents=True, exist_ok=True)
                    remove_stale(folder)
                self._hosts[host] = ""
            except OSError as exc:
                self._hosts[host] = f"could not prepare the agent's cgroups: {exc}"
                logger.warning("job limits are off: %s; jobs run without memory, CPU and process-count limits",
                               self._hosts[host])
        return self._hosts[host]

    def job(self, host: str, job_id: int, attempt: int, limits: Limits,
            gpu_minors: Iterable[int] | None = None) -> JobCgroup | None:
        """A job's cgroup, created with its limits; None where this agent has none (see `off_reason`).

        Raises CgroupError when the agent has cgroups but this job's cannot be set up: the job must not run
        without the limits it was promised.
        """
        if self.off_reason(host):
            return None
        name = f"job-{int(job_id)}-{int(attempt)}"
        dirs = {controller: folder / name for controller, folder in self.host_dirs(host).items()}
        group = JobCgroup(self.layout.version, dirs, limits)
        try:
            group.create()
            if gpu_minors is not None and "devices" in dirs:
                group.restrict_devices(denied_device_nodes(gpu_minors, self.dev_dir),
                                       allowed_device_nodes(gpu_minors, self.dev_dir))
        except OSError as exc:
            group.remove()
            raise CgroupError(exc.errno, f"could not set up the job's cgroup: {exc}") from exc
        return group

    def describe_off(self, host: str) -> dict[str, Any]:
        return {"applied": False, "reason": self.off_reason(host)}

    # --- what the runner calls

    def for_job(self, dispatch: Dispatch) -> JobCgroup | None:
        """The dispatched job's cgroup with its limits (on a real GPU host, its own GPUs' device nodes only)."""
        return self.job(dispatch.host, dispatch.job_id, dispatch.attempt, Limits.of(dispatch.cpus, dispatch.memory_gb),
                        gpu_minors=None if self.simulated else dispatch.gpu_indices)

    def describe(self, dispatch: Dispatch) -> dict[str, Any]:
        """What the running report says of the job's limits (runtime_info.limits)."""
        reason = self.off_reason(dispatch.host)
        if reason:
            return {"applied": False, "reason": reason}
        return {"applied": True, "cgroup": self.layout.version,
                **Limits.of(dispatch.cpus, dispatch.memory_gb).describe(), "devices": self._devices_note()}

    def _devices_note(self) -> str:
        if self.simulated:
            return "simulated GPUs: no device nodes"
        if self.layout.version == "v1" and "devices" in self.layout.mounts:
            return "other GPUs' /dev/nvidiaN denied by the devices cgroup"
        return "not isolated by the cgroup (v2 has no devices file; hide them in the job's mount namespace)"


class CgroupError(OSError):
    pass


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "host"


def _enable_v2_controllers(root: Path, parent: Path) -> None:
    """Create `parent` and enable our controllers on the way down from the root, so its children get them."""
    available = set((root / "cgroup.controllers").read_text().split())
    wanted = [name for name in V2_CONTROLLERS if name in available]
    folder = root
    for part in [None, *parent.relative_to(root).parts]:
        if part is not None:
            folder = folder / part
            folder.mkdir(exist_ok=True)
        enabled = set((folder / "cgroup.subtree_control").read_text().split())
        missing = [name for name in wanted if name not in enabled]
        if not missing:
            continue
        try:
            _write(folder / "cgroup.subtree_control", " ".join(f"+{name}" for name in missing))
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise CgroupError(exc.errno, f"cgroup v2: cannot enable {', '.join(missing)} in {folder}: it "
                                  "holds processes (no process may sit in an inner cgroup); give the agent a "
                                  "delegated cgroup or set GPU_AGENT_CGROUP_PARENT") from exc
            raise


# --- one job's cgroup


@dataclass
class JobCgroup:
    version: str  # "v1" | "v2"
    dirs: dict[str, Path]  # controller -> folder (v2: {"unified": folder})
    limits: Limits
    devices_denied: list[str] = field(default_factory=list)
    _peak: int | None = None

    def _dir(self, controller: str) -> Path | None:
        return self.dirs.get("unified") if self.version == "v2" else self.dirs.get(controller)

    def create(self) -> None:
        for folder in self.dirs.values():
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.mkdir(exist_ok=True)
        if self.version == "v2":
            self._write_v2()
        else:
            self._write_v1()

    def _write_v2(self) -> None:
        folder = self.dirs["unified"]
        limits = self.limits
        if limits.memory_bytes is not None:
            _write(folder / "memory.max", str(limits.memory_bytes))
            _write_if_present(folder / "memory.swap.max", "0")
            _write_if_present(folder / "memory.oom.group", "1")  # an OOM kill ends the whole job, not one worker
        if limits.cpus is not None and (folder / "cpu.max").exists():
            _write(folder / "cpu.max", f"{cfs_quota_us(limits.cpus)} {CFS_PERIOD_US}")
        if limits.pids is not None:
            _write(folder / "pids.max", str(limits.pids))

    def _write_v1(self) -> None:
        limits = self.limits
        memory = self.dirs["memory"]
        if limits.memory_bytes is not None:
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            # memsw (memory + swap) exists only with swap accounting; equal to the limit: no swap at all.
            _write_if_present(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            _write_if_present(memory / "memory.swappiness", "0")
        cpu = self.dirs.get("cpu")
        if limits.cpus is not None and cpu is not None:
            _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(cfs_quota_us(limits.cpus)))
        if limits.pids is not None:
            _write(self.dirs["pids"] / "pids.max", str(limits.pids))

    def restrict_devices(self, deny: list[DeviceNode], allow: list[DeviceNode]) -> None:
        """v1 devices controller: no access to other jobs' GPU nodes; the job's own and the shared ones stay."""
        folder = self.dirs.get("devices")
        if folder is None:
            return
        for node in deny:
            _write(folder / "devices.deny", node.rule())
            self.devices_denied.append(str(node.path))
        for node in allow:
            # Usually allowed already (inherited); refused only where a parent denies it, which we cannot lift.
            with contextlib.suppress(OSError):
                _write(folder / "devices.allow", node.rule())

    def procs_files(self) -> list[Path]:
        return [folder / "cgroup.procs" for folder in self.dirs.values()]

    def shim_options(self) -> list[str]:
        """The shim's arguments that make the job's first process join this cgroup before it execs."""
        return [option for path in self.procs_files() for option in ("--cgroup-procs", str(path))]

    # --- after the job

    def oom_kills(self) -> int | None:
        """How many processes the kernel's OOM killer ended in this cgroup; None where it is not counted."""
        folder = self._dir("memory")
        if folder is None:
            return None
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        return _read_keyed(folder / name).get("oom_kill")

    def oom_killed(self, returncode: int | None = None) -> bool:
        """Whether the job hit its memory limit and the kernel killed a process of it.

        v1 kernels before 4.13 have no `oom_kill` counter: there, the limit having been hit (memory.failcnt)
        together with the job's death by SIGKILL stands for it.
        """
        kills = self.oom_kills()
        if kills is not None:
            return kills > 0
        if self.version == "v1" and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
            folder = self._dir("memory")
            return folder is not None and (_read_int(folder / "memory.failcnt", 0) or 0) > 0
        return False

    def peak_memory_bytes(self) -> int | None:
        """The most memory the job used (v1 memory.max_usage_in_bytes, v2 memory.peak on kernels ≥ 5.19)."""
        if self._peak is not None:
            return self._peak
        folder = self._dir("memory")
        if folder is None:
            return None
        value = _read_int(folder / ("memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"), None)
        return value

    def oom_reason(self) -> str:
        limit = self.limits.memory_bytes
        what = f"its memory limit of {format_gb(limit)}" if limit is not None else "its memory limit"
        return f"out of memory: the job exceeded {what}"

    def end_and_report(self) -> dict[str, Any]:
        """Kill what is left inside; what the final report adds of the cgroup (the job's peak memory, if known).
        Quick: the final report waits for it, while remove() (which may retry for seconds) comes after it."""
        self._peak = self.peak_memory_bytes()
        unified = self.dirs.get("unified")
        if unified is not None:
            _write_if_present(unified / "cgroup.kill", "1")
        for folder in self.dirs.values():
            for pid in _read_pids(folder / "cgroup.procs"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        peak = self._peak
        return {} if peak is None else {"peak_memory_gb": round(peak / GIB, 3)}

    def remove(self) -> None:
        """Kill what is left inside, then remove the cgroup (retrying while the kernel still tears it down)."""
        if self._peak is None:
            self._peak = self.peak_memory_bytes()
        unified = self.dirs.get("unified")
        if unified is not None:
            _write_if_present(unified / "cgroup.kill", "1")
        for folder in sorted(self.dirs.values(), key=lambda path: len(path.parts), reverse=True):
            _remove_dir(folder)


def remove_stale(host_folder: Path) -> list[Path]:
    """Remove the job cgroups a previous run of this agent left (it died before its jobs' ends were handled)."""
    stale = sorted(host_folder.glob("job-*"))
    for folder in stale:
        _remove_dir(folder)
    if stale:
        logger.warning("removed %d job cgroups left by a previous run of the agent under %s", len(stale), host_folder)
    return stale


def _remove_dir(folder: Path) -> None:
    for attempt in range(REMOVE_ATTEMPTS):
        for pid in _read_pids(folder / "cgroup.procs"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                logger.warning("could not remove cgroup %s: %s", folder, exc)
                return
        time.sleep(0.05 * (attempt + 1))
    logger.warning("cgroup %s is still busy after %d attempts; left in place", folder, REMOVE_ATTEMPTS)


# --- GPU device nodes


@dataclass(frozen=True)
class DeviceNode:
    path: Path
    major: int
    minor: int

    def rule(self) -> str:
        return f"c {self.major}:{self.minor} rwm"


def _char_device(path: Path) -> DeviceNode | None:
    try:
        info = path.stat()
    except OSError:
        return None
    if not stat.S_ISCHR(info.st_mode):
        return None
    return DeviceNode(path, os.major(info.st_rdev), os.minor(info.st_rdev))


def gpu_device_nodes(dev_dir: Path = Path("/dev")) -> list[DeviceNode]:
    """The per-GPU nodes /dev/nvidiaN (character devices of major 195)."""
    nodes = [_char_device(path) for path in dev_dir.glob("nvidia*") if re.fullmatch(r"nvidia\d+", path.name)]
    return sorted((node for node in nodes if node and node.major == NVIDIA_MAJOR), key=lambda node: node.minor)


def denied_device_nodes(gpu_minors: Iterable[int], dev_dir: Path = Path("/dev")) -> list[DeviceNode]:
    """The GPU device nodes a job given the GPUs of these minor numbers must not open: every other /dev/nvidiaN.

    A GPU's minor number is NVML's `nvmlDeviceGetMinorNumber`, which is its index on most hosts. The lead's mount
    namespace can hide these same paths where there is no devices controller (cgroup v2).
    """
    own = set(gpu_minors)
    return [node for node in gpu_device_nodes(dev_dir) if node.minor not in own]


def allowed_device_nodes(gpu_minors: Iterable[int], dev_dir: Path = Path("/dev")) -> list[DeviceNode]:
    """What every CUDA job needs: its own /dev/nvidiaN, /dev/nvidiactl and /dev/nvidia-uvm*."""
    own = set(gpu_minors)
    shared = [_char_device(path) for path in sorted(dev_dir.glob("nvidia*"))
              if path.name == "nvidiactl" or path.name.startswith("nvidia-uvm")]
    return [*(node for node in gpu_device_nodes(dev_dir) if node.minor in own), *(node for node in shared if node)]


# --- files


def _write(path: Path, text: str) -> None:
    # One write() per value, as the kernel expects for cgroup files (no buffering split). O_APPEND changes
    # nothing for the kernel's files, and lets a plain file stand in for one in tests (rules accumulate).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _write_if_present(path: Path, text: str) -> None:
    try:
        _write(path, text)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.debug("cgroup: %s: %s", path, exc)


def _read_keyed(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    return values


def _read_int(path: Path, default: int | None) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return []


def join(procs_files: Iterable[str | Path]) -> None:
    """Put the calling process into each cgroup (its pid into each cgroup.procs): the shim's child, before exec.

    Raises OSError if one refuses: the job must not run outside the limits it was given."""
    pid = str(os.getpid())
    for path in procs_files:
        _write(Path(path), pid)
