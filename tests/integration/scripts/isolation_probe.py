"""A job that probes its isolation (tests/faults/test_job_isolation.py). Standard library only: it runs as an
unprivileged user, under a system Python that user can execute.

    identity SECONDS     print who it runs as and where, write progress and an output, then sleep
    snoop PATH...        try to list or read each path (pid:N: signal process N); print what happened
    daemon exit|stay     start a daemon (double fork + setsid) that sleeps forever; try to kill the shim
    flood                print forever as fast as it can, counting blocks in ./count
    garbage CODE         print random bytes, invalid UTF-8, NULs and one 5 MB line, then exit with CODE
"""

import os
import signal
import sys
import time


def identity(seconds: float) -> None:
    cwd = os.getcwd()
    with open("secret.txt", "w") as handle:
        handle.write("only this job may read this\n")
    with open(os.environ["CONSOLE_PROGRESS_FILE"], "a") as handle:  # read by the agent, which runs as root
        handle.write('{"type": "progress", "step": 7}\n')
    with open(os.path.join(os.environ["CONSOLE_OUTPUT_DIR"], "hello.txt"), "w") as handle:
        handle.write("an output of the job\n")
    print(f"identity uid={os.getuid()} gid={os.getgid()} groups={','.join(map(str, sorted(os.getgroups())))} "
          f"home={os.environ.get('HOME')} cwd={cwd} pid={os.getpid()}", flush=True)
    time.sleep(seconds)


def snoop(paths: list[str]) -> None:
    for path in paths:
        try:
            if path.startswith("pid:"):  # may it signal that process?
                os.kill(int(path[4:]), 0)
                what = "signalled"
            elif os.path.isdir(path):
                what = f"listed {len(os.listdir(path))} entries"
            else:
                with open(path, "rb") as handle:
                    what = f"read {len(handle.read())} bytes"
        except OSError as exc:
            what = type(exc).__name__
        print(f"snoop {path} {what}", flush=True)


def daemon(mode: str) -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: no parent, own session, stdio detached
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            with open("daemon.pid.part", "w") as handle:  # renamed when complete: never read half-written
                handle.write(str(os.getpid()))
            os.replace("daemon.pid.part", "daemon.pid")
            while True:
                time.sleep(3600)
        os._exit(0)
    os.wait()
    while not os.path.exists("daemon.pid"):
        time.sleep(0.05)
    with open("daemon.pid") as handle:
        print(f"daemon pid={handle.read()} cwd={os.getcwd()}", flush=True)
    try:
        os.kill(os.getppid(), signal.SIGKILL)
        print("kill-shim succeeded", flush=True)
    except OSError as exc:
        print(f"kill-shim {type(exc).__name__}", flush=True)
    if mode == "stay":
        time.sleep(600)


def flood() -> None:
    print(f"flood cwd={os.getcwd()}", flush=True)
    block = ("flood " + "x" * 94 + "\n") * 640  # 64 000 characters
    count = 0
    while True:
        sys.stdout.write(block)
        sys.stdout.flush()
        count += 1
        if count % 16 == 0:
            with open("count.tmp", "w") as handle:
                handle.write(str(count))
            os.replace("count.tmp", "count")


def garbage(code: int) -> None:
    out = sys.stdout.buffer
    out.write(b"garbage start\n")
    out.write(os.urandom(65536))
    out.write(b"\nbad utf-8: \xff\xfe\xc3\x28 \xe2\x82 \xf0\x9f\x98 nul: \x00\x00 end\n")
    out.write(b"\x00" * 1000 + b"\n")
    out.write(b"y" * 5_000_000 + b"\n")
    out.write(b"garbage end\n")
    out.flush()
    sys.exit(code)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "identity":
        identity(float(args[0]) if args else 0)
    elif command == "snoop":
        snoop(args)
    elif command == "daemon":
        daemon(args[0])
    elif command == "flood":
        flood()
    elif command == "garbage":
        garbage(int(args[0]))
    else:
        sys.exit(f"unknown command {command}")
