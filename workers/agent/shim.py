"""The job shim: the agent starts every job through it, and it owns the job's whole process tree.

    python -m workers.agent.shim --grace 5 --stop-file DIR/stop-grace [--uid U --gid G --groups G1,G2]
        [--cgroup-procs /sys/fs/cgroup/.../cgroup.procs ...] [--view DIR/view.json] [--cwd DIR --env-fd N] -- argv...

The shim runs as the agent, in a folder of the agent's and with the agent's environment: the job's own folder
(its uploaded code) and variables are the job's only. With --cwd and --env-fd (an inherited fd holding the job's
environment as JSON, read and closed at start), the job's first process moves to its folder and gets its variables
only after it has dropped privileges: a module of the job's code that shadows one the shim imports, or an
LD_PRELOAD or PYTHONPATH among its variables, never runs as the agent.

It makes itself a child subreaper, so every process the job starts stays in its subtree even when the job
daemonizes or when torchrun puts its workers in process groups of their own. It ends the whole tree:
- when the job's main process exits (leftovers are killed, then the shim exits with the main process's status);
- on SIGTERM from the agent (forwarded to the tree; SIGKILL after the grace period);
- when the agent dies, even by kill -9 (the kernel sends the shim SIGTERM through PR_SET_PDEATHSIG).

With --orphan-cleanup (a JSON argv: the container backend's `podman rm -f NAME`), the shim runs that command
once the tree is gone if the agent died meanwhile (retrying until it succeeds or a minute has passed), so a job's
container does not outlive it either.

With --uid (the agent's --run-as user), only the job's processes switch to that user: the shim keeps the agent's
identity, so the job can neither signal its supervisor nor leave the subtree it reaps and kills. With --view (a
file of the agent's), the job's first process enters a private mount namespace laid out as the file says
(workers/agent/sandbox.py) before it drops privileges, and no program it runs can gain any (no_new_privs).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from workers.agent import cgroups
from workers.agent.sandbox import FilesystemView, SandboxError, enter

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05  # while a stopped job's leftovers are killed
IDLE_WAKE_S = 60.0  # no signal is lost while blocked: this wake-up is only a safety net
WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}  # blocked in the shim, taken by sigtimedwait
CLEANUP_TIMEOUT_S = 60.0


def shim_environment() -> dict[str, str]:
    """The variables the shim is started with: the agent's, only what running Python needs (never the job's)."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "TMPDIR")}


def in_memory_file(data: bytes) -> int:
    """An fd of a memfd holding `data`, read from its start: how a job's variables reach the shim (or podman),
    never on disk or on a command line. The caller closes it once the shim has started."""
    fd = os.memfd_create("job-env", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def descendants(root: int) -> list[int]:
    """Every process below `root`, read from /proc (children first is not needed: we signal them all)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: the fields after the last ')' are fixed.
        fields = stat[stat.rfind(")") + 2:].split()
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in parents.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def signal_tree(sig: int) -> None:
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def why_not_found(command: str, path: str | None = None) -> str | None:
    """Why exec found no `command`, as the job sees its files (called inside its view, as its user): the bare
    "No such file or directory" of a command the host has but the job's view hides (a pyenv shim under a private
    home, say) or of a script whose interpreter is missing leaves a user guessing. None: no better reason."""
    if "/" in command:
        found: str | None = command if os.path.exists(command) else None
        if found is None:
            return f"{command}: no such file in the job's view"
    else:
        found = shutil.which(command, path=path)
        if found is None:
            return (f"{command}: command not found on the job's PATH ({path}); the host's "
                    f"private folders (such as a home's pyenv shims) are not in a job's view")
    interpreter = _interpreter(found)
    if interpreter is not None and not os.path.exists(interpreter):
        where = "" if found == command else f" ({found})"
        return f"{command}{where} is a script whose interpreter {interpreter} is not in the job's view"
    return None


def _interpreter(path: str) -> str | None:
    """The program a script's "#!" line names, or None."""
    try:
        with open(path, "rb") as script:
            first = script.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].split()
    return words[0].decode(errors="replace") if words else None


class Shim:
    def __init__(self, argv: list[str], grace_s: float, stop_file: Path | None,
                 user: tuple[int, int, list[int]] | None = None, cgroup_procs: list[str] | None = None,
                 view: FilesystemView | None = None, cwd: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.cwd = cwd  # the job's working directory, entered as its user (None: the shim's)
        self.env = env  # the job's environment (None: the shim's)
        self.cgroup_procs = cgroup_procs or []  # the job's cgroup(s): its first process joins before exec
        self.view = view
        self.grace_s = grace_s
        self.stop_file = stop_file
        self.user = user  # (uid, gid, supplementary groups) the job runs as; None: the shim's own
        self.main_pid = 0
        self.main_status: int | None = None
        self.kill_at: float | None = None
        self.parent = os.getppid()
        self.mask: set[int | signal.Signals] = set()  # the signal mask the shim started with, the job's too

    def on_term(self, signum: int, frame: object) -> None:
        if self.kill_at is not None:
            return
        grace = self.grace_s
        if self.stop_file is not None:
            with contextlib.suppress(OSError, ValueError):
                grace = float(self.stop_file.read_text())
        self.kill_at = time.monotonic() + grace
        signal_tree(signal.SIGTERM)

    def spawn(self) -> None:
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
                try:  # still privileged; the shim itself stays outside. Never run a job without its limits.
                    cgroups.join(self.cgroup_procs)
                except OSError as exc:
                    print(f"[agent] could not start the job in its cgroup: {exc}", file=sys.stderr, flush=True)
                    os._exit(126)
                if self.view is not None:
                    enter(self.view)
                if self.user is not None:
                    uid, gid, groups = self.user
                    os.setgroups(groups)
                    os.setresgid(gid, gid, gid)
                    os.setresuid(uid, uid, uid)
                    _prctl(PR_SET_NO_NEW_PRIVS, 1)
                if self.cwd is not None:
                    os.chdir(self.cwd)
                if self.env is None:
                    os.execvp(self.argv[0], self.argv)
                os.execvpe(self.argv[0], self.argv, self.env)
            except OSError as exc:
                missing = exc.errno == errno.ENOENT and not isinstance(exc, SandboxError)
                path = (self.env if self.env is not None else os.environ).get("PATH", "")
                why = why_not_found(self.argv[0], path) if missing else None
                print(f"[agent] could not start the job: {why or exc}", file=sys.stderr, flush=True)
                os._exit(127 if missing else 126)
        self.main_pid = pid

    def reap(self) -> bool:
        """Reap every exited child; False once no child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.main_pid:
                self.main_status = status

    def run(self) -> int:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        # The shim sleeps until a child ends or it is asked to stop, never polling: an idle job's tree costs no
        # CPU (its CPU is what the simulated GPU reads as utilization; 20 wake-ups a second read as a busy GPU on a
        # loaded host now and then, and called off an idle job's release).
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        try:
            if self.orphaned():  # the agent died before the death signal was armed
                return 1
            self.spawn()
            while self.reap():
                now = time.monotonic()
                if self.main_status is not None or (self.kill_at is not None and now >= self.kill_at):
                    # The job's main process is done (or its grace is over): nothing it left may keep running.
                    signal_tree(signal.SIGKILL)
                    timeout = POLL_S
                else:
                    timeout = self.kill_at - now if self.kill_at is not None else IDLE_WAKE_S
                received = signal.sigtimedwait(WATCHED, timeout)
                if received is not None and received.si_signo != signal.SIGCHLD:
                    self.on_term(received.si_signo, None)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
        return self.main_status if self.main_status is not None else 0

    def orphaned(self) -> bool:
        """Whether the agent that started the shim is gone."""
        return os.getppid() != self.parent


def orphan_cleanup(argv: list[str], deadline_s: float = CLEANUP_TIMEOUT_S) -> bool:
    """Run the cleanup command until it succeeds (removing a container that is gone succeeds too).

    One try is not enough: podman refuses the removal while conmon's own exit command still holds the container.
    What happened goes to the job's log, which may no longer be read but stays on the host.
    """
    deadline = time.monotonic() + deadline_s
    attempt = 0
    while True:
        attempt += 1
        try:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=max(1.0, deadline - time.monotonic()), check=False)
            if result.returncode == 0:
                return True
            problem = f"exit {result.returncode}: {result.stderr.strip()[-300:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = str(exc)
        if time.monotonic() >= deadline:
            print(f"[agent] the agent is gone and the job's cleanup failed after {attempt} tries: {problem}",
                  file=sys.stderr, flush=True)
            return False
        time.sleep(min(0.2 * attempt, 2.0))


def exit_like(status: int) -> None:
    """Leave with the main process's status: its exit code, or death by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be caught, nor their handler set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)
        sys.exit(128 + sig)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpu-agent-shim")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--uid", type=int, help="run the job's processes as this user id (the shim stays as is)")
    parser.add_argument("--gid", type=int)
    parser.add_argument("--groups", default="", help="supplementary group ids, comma-separated")
    parser.add_argument("--view", type=Path, help="the job's filesystem view (JSON, see workers/agent/sandbox.py)")
    parser.add_argument("--cgroup-procs", action="append", default=[], metavar="FILE",
                        help="a cgroup.procs file the job's first process joins before it execs (repeatable)")
    parser.add_argument("--orphan-cleanup", metavar="JSON",
                        help="a command (JSON list) to run after the tree is gone, if the agent died meanwhile")
    parser.add_argument("--cwd", help="the job's working directory, entered once it runs as its user")
    parser.add_argument("--env-fd", type=int, help="an inherited fd holding the job's environment (JSON object)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    user = None
    if args.uid is not None:
        if args.gid is None:
            parser.error("--uid needs --gid")
        user = (args.uid, args.gid, [int(group) for group in args.groups.split(",") if group])
    view = FilesystemView.from_json(args.view.read_text()) if args.view else None
    env = None
    if args.env_fd is not None:
        with os.fdopen(args.env_fd, "rb") as source:  # closed here: the job never inherits it
            env = {str(k): str(v) for k, v in json.loads(source.read()).items()}
    shim = Shim(command, args.grace, args.stop_file, user, args.cgroup_procs, view, args.cwd, env)
    status = shim.run()
    if args.orphan_cleanup and shim.orphaned():
        orphan_cleanup([str(arg) for arg in json.loads(args.orphan_cleanup)])
    exit_like(status)


if __name__ == "__main__":
    main()
