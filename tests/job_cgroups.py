"""Job cgroups of this test process apart from every other's.

An agent's JobRunner removes the job cgroups it finds under its parent for a host at its start (those a previous
run left). Tests in several pytest-xdist workers start runners for the same host names at once, so each test process
gets a parent of its own (GPU_AGENT_CGROUP_PARENT, unless the caller set one), or one runner's start would kill
another test's job. Live clusters set theirs per cluster. What is left (empty folders) is removed at the end.
Workers inherit the controller's environment: a value of ours from there is replaced by the worker's own.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ENV = "GPU_AGENT_CGROUP_PARENT"
PREFIX = "gpu-agent-test-"


def isolate() -> None:
    if os.environ.get(ENV, PREFIX).startswith(PREFIX):
        os.environ[ENV] = f"{PREFIX}{os.getpid()}"


def remove_own() -> None:
    """Remove this process's (empty) parent folders from every controller's hierarchy; best effort."""
    from workers.agent.cgroups import detect

    name = os.environ.get(ENV, "")
    if name != f"{PREFIX}{os.getpid()}":
        return
    for mount in detect().mounts.values():
        for top, folders, _ in os.walk(mount):
            if name in folders:
                for inner, _, _ in sorted(os.walk(Path(top) / name), key=lambda w: -len(w[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(inner)
                folders.remove(name)
