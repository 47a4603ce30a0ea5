"""Start overhead of the container backend against the process backend: a trivial job (`true`), from
JobRunner.start to the final report the console receives, a few times each.

    python -m tests.containers.measure [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.containers import images
from tests.containers.conftest import JOB_UIDS, Agent, Console, _handler, oci_runtime
from workers.agent.client import ConsoleClient
from workers.agent.containers import ContainerRuntime
from workers.agent.runner import JobRunner, JobUids


def timings(console: Console, agent: Agent, image: str, runs: int) -> list[float]:
    spent = []
    for _ in range(runs):
        dispatch = agent.dispatch(image, ["true"])  # no image: the process backend
        started = time.monotonic()
        agent.runner.start(dispatch)
        final = console.wait_final(dispatch.job_id)
        spent.append(time.monotonic() - started)
        assert final["state"] == "succeeded", console.log(dispatch.job_id)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    images.ensure(images.BASE_IMAGE)
    console = Console()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(console))
    console.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as folder:
        runtime = ContainerRuntime("podman", oci_runtime=oci_runtime(), simulated=True)
        for backend, containers, image in (("process", None, ""), ("podman", runtime, images.BASE_IMAGE)):
            root = Path(folder) / backend
            runner = JobRunner(ConsoleClient(console.url, "t"), work_root=root / "work",
                               artifacts_root=root / "artifacts", simulated=True, job_uids=JobUids(*JOB_UIDS),
                               console_url=console.url, containers=containers)
            agent = Agent(runner, f"measure-{backend}", root, console, next_id=1000 if containers else 1)
            spent = timings(console, agent, image, runs)
            print(f"{backend}: trivial job start to end, median {statistics.median(spent):.2f} s "
                  f"(min {min(spent):.2f}, max {max(spent):.2f}, {runs} runs)")
    server.shutdown()


if __name__ == "__main__":
    main()
