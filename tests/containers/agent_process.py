"""A container agent in a process of its own, for the kill -9 test: it starts one dispatch (JSON on argv) with a
JobRunner like the conftest's (argv: console URL, root folder, dispatch, container CLI), prints "started", and
waits to be killed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.containers.conftest import JOB_UIDS, oci_runtime
from workers.agent.client import ConsoleClient
from workers.agent.containers import ContainerRuntime
from workers.agent.runner import JobRunner, JobUids
from workers.protocol import Dispatch

if __name__ == "__main__":
    console_url, root, message, kind = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    runtime = ContainerRuntime(kind, oci_runtime=oci_runtime() if kind == "podman" else "", simulated=True)
    runner = JobRunner(ConsoleClient(console_url, "host-token"), work_root=root / "work",
                       artifacts_root=root / "artifacts", simulated=True, job_uids=JobUids(*JOB_UIDS),
                       console_url=console_url, containers=runtime)
    print(runner.start(Dispatch.from_message(message)), flush=True)
    while True:
        time.sleep(60)
