"""CPU time and RSS of a process tree, read from /proc (Linux), without psutil.

A job is a root process plus everything it started (torchrun and its workers, DataLoader workers). The tree
is walked through ``/proc/<pid>/task/<tid>/children`` (cost proportional to the job, not to the host) every
``walk_interval_s`` seconds and whenever the root ends; in between only the known members' ``stat`` files
are read, so a newly started child is counted at most ``walk_interval_s`` late. Members of the root's process
group that leave the tree (orphans whose parent died, e.g. workers of a killed launcher) stay counted; a full
``/proc`` scan every ``group_scan_s`` seconds also finds group members never seen in the tree. Kernels
without the ``children`` files get full scans instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROC = "/proc"


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    cpu_ticks: int  # utime + stime
    start_ticks: int  # start time after boot, in clock ticks: (pid, start_ticks) identifies a process
    rss_bytes: int


def read_stat(pid: int, proc: str = PROC) -> ProcStat | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    end = data.rfind(b")")
    if end < 0:
        return None
    fields = data[end + 2 :].split()
    try:
        return ProcStat(
            pid=pid,
            state=fields[0].decode(),
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            start_ticks=int(fields[19]),
            rss_bytes=int(fields[21]) * PAGE_SIZE,
        )
    except (IndexError, ValueError):
        return None


def _children(pid: int, proc: str) -> list[int] | None:
    """Direct children of pid, from every thread's children file; None if the kernel lacks these files."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    missing = 0
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(p) for p in f.read().split())
        except FileNotFoundError:
            missing += 1
        except (OSError, ValueError):
            continue
    if missing and missing == len(tids) and os.path.exists(f"{proc}/{pid}"):
        return None
    return found


def _all_stats(proc: str) -> dict[int, ProcStat]:
    stats: dict[int, ProcStat] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return stats
    for name in names:
        if name.isdigit():
            st = read_stat(int(name), proc)
            if st is not None:
                stats[st.pid] = st
    return stats


@dataclass
class TreeUsage:
    alive: bool  # some process of the job still runs (the root, or orphans of its process group)
    cpu_cores: float  # average CPU use of the tree since the previous reading, in cores
    rss_mb: int
    pids: tuple[int, ...]


class ProcessTreeMeter:
    """Measures CPU use (in cores) and RSS of process trees between successive readings.

    One meter per sampler; ``measure(roots)`` reads every root once (a pid attached to several GPUs is read
    once per call). Processes seen for the first time count from the moment they are first seen, so joining
    an existing process never shows a burst of its past CPU time.
    """

    def __init__(
        self,
        *,
        proc: str = PROC,
        monotonic: Callable[[], float] = time.monotonic,
        walk_interval_s: float = 5.0,
        group_scan_s: float = 60.0,
        min_interval_s: float = 0.2,
    ) -> None:
        self.proc = proc
        self.monotonic = monotonic
        self.walk_interval_s = walk_interval_s
        self.group_scan_s = group_scan_s
        self._walked: dict[int, float] = {}  # root -> when its tree was last walked
        self.min_interval_s = min_interval_s
        self._result: dict[int, TreeUsage] = {}
        self._has_children_files: bool | None = None
        self._last: dict[
            int, tuple[float, dict[tuple[int, int], int]]
        ] = {}  # root -> (t, {(pid,start): ticks})
        self._group_extra: dict[int, set[int]] = {}  # root -> pids in its group found by the full scan
        self._pgrp: dict[int, int] = {}  # root -> its process group, as last seen alive
        self._root_start: dict[int, int] = {}  # root -> its start time: tells a reused pid apart
        self._last_group_scan = -float("inf")

    def _descendants(
        self, start: list[ProcStat], seen: set[int], scan: dict[int, ProcStat] | None
    ) -> list[ProcStat]:
        out: list[ProcStat] = []
        if scan is not None:
            by_parent: dict[int, list[int]] = {}
            for st in scan.values():
                by_parent.setdefault(st.ppid, []).append(st.pid)
            stack = [st.pid for st in start]
            while stack:
                for child in by_parent.get(stack.pop(), ()):
                    if child not in seen:
                        seen.add(child)
                        out.append(scan[child])
                        stack.append(child)
            return out
        stack = [st.pid for st in start]
        while stack:
            kids = _children(stack.pop(), self.proc)
            if kids is None:  # no children files on this kernel: full scans from now on
                self._has_children_files = False
                return self._descendants(start, seen, _all_stats(self.proc))
            for child in kids:
                if child in seen:
                    continue
                st = read_stat(child, self.proc)
                if st is not None:
                    seen.add(child)
                    out.append(st)
                    stack.append(child)
        return out

    def _tree(self, root: int, scan: dict[int, ProcStat] | None) -> list[ProcStat]:
        """The root (first, when alive), its descendants, and live members of its process group that left the
        tree (orphans: their parent died, yet they still belong to the job, e.g. torchrun workers)."""
        read = (lambda pid: scan.get(pid)) if scan is not None else (lambda pid: read_stat(pid, self.proc))
        root_stat = read(root)
        if (
            root_stat is not None
            and self._root_start.setdefault(root, root_stat.start_ticks) != root_stat.start_ticks
        ):
            root_stat = None  # the job's root died and its pid now belongs to another process
        seen = {root}
        out: list[ProcStat] = []
        if root_stat is not None and root_stat.state not in ("Z", "X"):
            self._pgrp[root] = root_stat.pgrp
            out.append(root_stat)
            out += self._descendants([root_stat], seen, scan)
        if self._pgrp.get(root) == root:  # a group leader (jobs run in their own session): follow its group
            previous = {pid for pid, _ in self._last.get(root, (0.0, {}))[1]}
            orphans = []
            for pid in sorted((previous | self._group_extra.get(root, set())) - seen):
                st = read(pid)
                if st is not None and st.pgrp == root:
                    seen.add(pid)
                    orphans.append(st)
            out += orphans + self._descendants(orphans, seen, scan)
        return out

    def _reread(self, root: int, now: float) -> list[ProcStat] | None:
        """The members found by the last walk, re-read; None when a new walk is due (interval passed, root gone)."""
        if now - self._walked.get(root, -float("inf")) >= self.walk_interval_s or root not in self._last:
            return None
        members = []
        for pid, start in self._last[root][1]:
            st = read_stat(pid, self.proc)
            if st is not None and st.start_ticks == start and st.state not in ("Z", "X"):
                members.append(st)
            elif pid == root:
                return None  # the root ended: walk again to follow its orphans (or see the job is over)
        if not members or members[0].pid != root:
            return None
        return members

    def _refresh_groups(self, roots: Iterable[int]) -> dict[int, ProcStat]:
        scan = _all_stats(self.proc)
        wanted = set(roots)
        self._group_extra = {root: set() for root in wanted}
        for st in scan.values():
            if st.pgrp in wanted and st.pid != st.pgrp:
                self._group_extra[st.pgrp].add(st.pid)
        return scan

    def measure(self, roots: Iterable[int]) -> dict[int, TreeUsage]:
        roots = sorted(set(roots))
        for gone in set(self._last) - set(roots):
            del self._last[gone]
            self._result.pop(gone, None)
            self._pgrp.pop(gone, None)
            self._root_start.pop(gone, None)
            self._walked.pop(gone, None)
        if not roots:
            return {}
        now = self.monotonic()
        # Readings closer together than min_interval_s would only measure clock-tick noise: repeat the last.
        fresh = [r for r in roots if not (r in self._result and now - self._last[r][0] < self.min_interval_s)]
        result: dict[int, TreeUsage] = {r: self._result[r] for r in roots if r not in fresh}
        if not fresh:
            return result
        scan: dict[int, ProcStat] | None = None
        if now - self._last_group_scan >= self.group_scan_s:
            self._last_group_scan = now
            scan = self._refresh_groups(roots)
        elif self._has_children_files is False:
            scan = _all_stats(self.proc)
        for root in fresh:
            members = None if scan is not None else self._reread(root, now)
            if members is None:
                members = [st for st in self._tree(root, scan) if st.state not in ("Z", "X")]
                self._walked[root] = now
            ticks = {(st.pid, st.start_ticks): st.cpu_ticks for st in members}
            prev_t, prev = self._last.get(root, (None, {}))
            cpu = 0.0
            if prev_t is not None and now > prev_t:
                delta = sum(t - prev[key] for key, t in ticks.items() if key in prev and t >= prev[key])
                cpu = delta / CLK_TCK / (now - prev_t)
            self._last[root] = (now, ticks)
            result[root] = TreeUsage(
                alive=bool(members),
                cpu_cores=cpu,
                rss_mb=sum(st.rss_bytes for st in members) // (1024 * 1024),
                pids=tuple(st.pid for st in members),
            )
        self._result.update(result)
        return result
