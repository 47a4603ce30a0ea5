"""The host agent: registers the host and its GPUs, heartbeats, and runs the jobs sent to its Celery queue.

    gpu-agent --console-url http://console:8000 --broker redis://redis:6379/1 --token-file /etc/gpu-agent/token
    gpu-agent --simulate 4xH200 ...        # simulated GPUs, for machines without an NVIDIA driver
    gpu-agent --simulate-without-driver 4xH200 ...   # the real GPUs where a driver answers, else simulated
    gpu-agent --runtime podman --volume-root /data ...   # jobs that name an image run in OCI containers
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from celery import Celery
from celery.signals import worker_shutdown

from workers.agent.cgroups import host_capacity
from workers.agent.client import AgentConfigError, ConsoleClient
from workers.agent.containers import ContainerRuntime
from workers.agent.gpus.base import GpuBackend
from workers.agent.runner import JobProcess, JobRunner, JobUids, RunAs, kill_leftover_jobs, resolve_run_as
from workers.agent.sandbox import views_unavailable
from workers.agent.sharing import over_share
from workers.agent.telemetry import TelemetryLoop
from workers.broker import TRANSPORT as FILESYSTEM_TRANSPORT
from workers.protocol import (
    CONTAINER_RUNTIMES,
    HEARTBEAT_INTERVAL_S,
    PROTOCOL_VERSION,
    RESHARE_JOB_TASK,
    RUN_JOB_TASK,
    STOP_JOB_TASK,
    Dispatch,
    GpuRecord,
    ProtocolError,
    Registration,
    host_queue,
    valid_address,
)

AGENT_VERSION = "0.1.0"
# Job uids of a root agent by default: far above the ranges distributions give accounts and subordinate ids.
DEFAULT_JOB_UIDS = "1610000000-1610009999"
IMAGES_EVERY_BEATS = 12  # a container host's image list is checked about once a minute
logger = logging.getLogger("workers.agent")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-agent", description=__doc__.split("\n")[0])
    parser.add_argument("--name", default=os.environ.get("GPU_AGENT_NAME") or socket.gethostname(),
                        help="host name as registered in the console (default: this machine's host name)")
    parser.add_argument("--console-url", default=os.environ.get("GPU_AGENT_CONSOLE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--broker", default=os.environ.get("CELERY_BROKER_URL", "filesystem://"),
                        help="Celery broker URL (redis://, amqp://, or filesystem:// with --broker-dir)")
    parser.add_argument("--broker-dir", default=os.environ.get("GPU_AGENT_BROKER_DIR", "var/broker"),
                        help="folder of the filesystem:// broker, shared with the console")
    parser.add_argument("--token-file", default=os.environ.get("GPU_AGENT_TOKEN_FILE"),
                        help="file holding the host token (or set GPU_AGENT_TOKEN)")
    parser.add_argument("--simulate", default=os.environ.get("GPU_AGENT_SIMULATE"),
                        help="simulated GPUs, e.g. 4xH200 (default: NVML)")
    parser.add_argument("--simulate-without-driver", metavar="SPEC",
                        default=os.environ.get("GPU_AGENT_SIMULATE_WITHOUT_DRIVER"),
                        help="NVML's GPUs where an NVIDIA driver answers, else these simulated ones, with a warning "
                             "(make run's agent)")
    parser.add_argument("--work-dir", default=os.environ.get("GPU_AGENT_WORK_DIR"),
                        help="where job working directories go (default: var/agent/<name>)")
    parser.add_argument("--artifacts", default=os.environ.get("CONSOLE_ARTIFACTS", "var/artifacts"),
                        help="artifact store directory shared with the console (path or file:// URL)")
    parser.add_argument("--address", default=os.environ.get("GPU_AGENT_ADDRESS") or default_address(),
                        help="address the console and other hosts use to reach this one (multi-host rendezvous, "
                             "inference replicas); default: this host name's address")
    parser.add_argument("--concurrency", type=int, default=8, help="dispatch messages handled at once")
    parser.add_argument("--grace-s", type=float, default=5.0, help="SIGTERM to SIGKILL grace when stopping jobs")
    parser.add_argument("--no-mps", action="store_true",
                        help="never use NVIDIA MPS for shared GPUs (the allocator cap and the memory watch remain)")
    parser.add_argument("--fault-file", default=os.environ.get("GPU_AGENT_FAULT_FILE"),
                        help="simulated backend: JSON file of injected faults")
    parser.add_argument("--run-as", default=os.environ.get("GPU_AGENT_RUN_AS") or os.environ.get("CONSOLE_AGENT_RUN_AS") or None,
                        metavar="USER",
                        help="run job processes as this unprivileged user (its uid, gid and groups), each in a "
                             "private work directory; the agent must run as root (env GPU_AGENT_RUN_AS)")
    parser.add_argument("--job-uids", default=os.environ.get("GPU_AGENT_JOB_UIDS") or None, metavar="FIRST-LAST",
                        help="run each job under a uid of its own from this range (no account may use them), so "
                             "jobs cannot read each other's files or signal each other's processes; the default "
                             f"for an agent running as root without --run-as ({DEFAULT_JOB_UIDS}); 'off' runs "
                             "jobs as the agent's user (env GPU_AGENT_JOB_UIDS)")
    parser.add_argument("--private", action="append", type=Path,
                        default=[Path(p) for p in os.environ.get("GPU_AGENT_PRIVATE", "").split(os.pathsep) if p],
                        metavar="DIR", help="a folder jobs must not see (the console's state beside the agent, "
                                            "e.g. var/ under `make run`); repeatable (env GPU_AGENT_PRIVATE, "
                                            "colon-separated). The work dir, the artifact store, the broker's "
                                            "folders and the token file are always hidden")
    parser.add_argument("--pass-env", action="append",
                        default=[n for n in os.environ.get("GPU_AGENT_PASS_ENV", "").split(",") if n],
                        metavar="NAME", help="an environment variable of the agent's that jobs inherit besides "
                                             "the built-in allow-list; repeatable (env GPU_AGENT_PASS_ENV)")
    parser.add_argument("--runtime", choices=CONTAINER_RUNTIMES, default=os.environ.get("GPU_AGENT_RUNTIME") or "process",
                        help="how jobs that name an image run: in podman or docker containers; 'process' (the "
                             "default) runs every job on the host and fails jobs that name an image "
                             "(env GPU_AGENT_RUNTIME)")
    parser.add_argument("--volume-root", action="append", type=Path,
                        default=[Path(p) for p in os.environ.get("GPU_AGENT_VOLUME_ROOTS", "").split(os.pathsep) if p],
                        metavar="PATH", help="a folder under which the console's named volumes may be bound into "
                                             "jobs (containers, and process jobs under --job-uids); any other "
                                             "mount source fails the job; repeatable (env GPU_AGENT_VOLUME_ROOTS, "
                                             "colon-separated)")
    parser.add_argument("--oci-runtime", default=os.environ.get("GPU_AGENT_OCI_RUNTIME", ""), metavar="NAME",
                        help="the OCI runtime podman/docker use (e.g. runc where crun cannot run: cgroup v1 "
                             "hybrid hosts); default: theirs (env GPU_AGENT_OCI_RUNTIME)")
    parser.add_argument("--log-level", default=os.environ.get("GPU_AGENT_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    if not valid_address(args.address):
        parser.error(f"--address {args.address!r} (GPU_AGENT_ADDRESS): expected an IP address or a host name "
                     "(letters, digits, hyphens and dots), with no scheme, port, path or user")
    return args


def default_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def read_token(args: argparse.Namespace) -> str:
    token = os.environ.get("GPU_AGENT_TOKEN", "").strip()
    if not token and args.token_file:
        token = Path(args.token_file).read_text().strip()
    if not token:
        raise SystemExit("gpu-agent: no host token: set GPU_AGENT_TOKEN or --token-file "
                         "(an admin issues one with `manage.py issue_host_token <host>`)")
    return token


def resolve_job_uids(option: str | None, run_as: RunAs | None) -> JobUids | None:
    """Each job under a uid of its own: by default wherever the agent can switch users (it runs as root)."""
    if option == "off":
        if os.geteuid() == 0 and run_as is None:
            logger.warning("--job-uids off: jobs run as root, like the agent, and can read everything on this host")
        return None
    if option is None:
        if os.geteuid() != 0 or run_as is not None:
            return None  # cannot switch users; or the one --run-as user was asked for
        why = views_unavailable()
        if why is not None:
            logger.warning("jobs run as the agent's user, root: %s, so a job under another uid could not reach "
                           "its files; give the agent CAP_SYS_ADMIN (in a container) to isolate jobs", why)
            return None
        option = DEFAULT_JOB_UIDS
    elif os.geteuid() != 0:
        raise SystemExit(f"gpu-agent: --job-uids {option} needs the agent to run as root, to start jobs under "
                         f"other uids; this agent runs as uid {os.geteuid()}. Start it as root, or drop --job-uids.")
    return JobUids.parse(option)


def check_views(run_as: RunAs | None, job_uids: JobUids | None) -> None:
    """Jobs under another user need their filesystem view: refuse to start where it cannot be built."""
    if run_as is None and job_uids is None:
        return
    why = views_unavailable()
    if why is not None:
        raise SystemExit(f"gpu-agent: jobs under other users need a filesystem view of their own, but {why}; give "
                         "the agent CAP_SYS_ADMIN (in a container), or drop --run-as/--job-uids")


def hidden_from_jobs(args: argparse.Namespace) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """What a job's filesystem view covers besides the work and artifact roots: folders (the --private ones, the
    filesystem broker's) and files (the host token)."""
    private = [*args.private]
    if args.broker.startswith("filesystem"):
        broker = Path(args.broker_dir).resolve()
        private += [broker, broker.parent / "broker-control"]
    masked = (Path(args.token_file).resolve(),) if args.token_file else ()
    return tuple(private), masked


def describe_isolation(run_as: RunAs | None, job_uids: JobUids | None) -> str:
    if job_uids is not None:
        return (f"each job runs under a uid of its own ({job_uids.first}-{job_uids.last}) in a private filesystem "
                "view: it sees its own work folder and artifacts, not the agent's state, token or other jobs")
    if run_as is not None:
        return (f"jobs run as {run_as.name} (uid {run_as.uid}), all of them under that one uid, in private "
                "filesystem views: they cannot read the agent's state, but can reach each other's processes")
    if os.geteuid() == 0:
        return ("jobs run as root, like the agent (--job-uids off, or no filesystem view can be built here): a job "
                "can read and change everything on this host, the agent's token included")
    return (f"jobs share the agent's user (uid {os.geteuid()}): this agent cannot switch users (it does not run as "
            "root), so a job can read whatever the agent can, its host token included")


def artifacts_path(value: str) -> Path:
    parsed = urlparse(value)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme:
        raise SystemExit(f"gpu-agent: --artifacts must be a directory (shared mount) or file:// URL, not {value!r}")
    return Path(value)


def open_gpu_backend(args: argparse.Namespace) -> GpuBackend:
    from workers.agent.gpus import NoGpuBackend, open_backend

    try:
        return open_backend(args.simulate, host_name=args.name, fault_file=args.fault_file,
                            fallback_simulate=args.simulate_without_driver)
    except NoGpuBackend as exc:
        raise SystemExit(f"gpu-agent: {exc}") from None


def open_container_runtime(args: argparse.Namespace, backend: GpuBackend) -> ContainerRuntime | None:
    if args.runtime == "process":
        return None
    if os.geteuid() != 0:
        raise SystemExit(f"gpu-agent: --runtime {args.runtime} needs the agent to run as root (it starts each "
                         "job's container under the job's own uid)")
    runtime = ContainerRuntime(args.runtime, volume_roots=tuple(args.volume_root), oci_runtime=args.oci_runtime,
                               simulated=backend.kind == "simulated",
                               gpus={d.index: (d.uuid, d.memory_mb) for d in backend.devices()})
    why = runtime.available()
    if why:
        raise SystemExit(f"gpu-agent: --runtime {args.runtime}: {why}")
    return runtime


def registration(args: argparse.Namespace, backend: GpuBackend, containers: ContainerRuntime | None = None,
                 job_isolation: str = "") -> Registration:
    info = backend.driver_info()
    return Registration(
        host=args.name,
        agent_version=AGENT_VERSION,
        simulated=backend.kind == "simulated",
        gpus=[GpuRecord(d.index, d.uuid, d.name, d.gpu_type, d.memory_mb) for d in backend.devices()],
        driver_version=info.get("driver_version", ""),
        cuda_version=info.get("cuda_version", ""),
        address=args.address,
        cpus=host_capacity()[0],
        memory_mb=host_capacity()[1],
        runtime=containers.kind if containers else "process",
        job_isolation=job_isolation,
        images=containers.images() if containers else [],
        protocol=PROTOCOL_VERSION,
    )


def register_until_accepted(client: ConsoleClient, message: Registration, stop: threading.Event) -> dict[str, Any]:
    delay = 1.0
    while not stop.is_set():
        try:
            reply = client.register(message)
            logger.info("registered host %s with %d %s GPUs; queue %s", message.host, len(message.gpus),
                        "simulated" if message.simulated else "NVML", reply["queue"])
            return reply
        except AgentConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - the console may not be up yet
            logger.warning("console not reachable for registration (%s); retrying in %.0f s", exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, 15.0)
    raise SystemExit(0)


def refresh_images(client: ConsoleClient, containers: ContainerRuntime, message: Registration) -> Registration:
    """Register again when the host's images changed (a pull, an admin's prune): the host page lists them."""
    images = containers.images()
    if images == message.images:
        return message
    try:
        client.register(replace(message, images=images))
    except Exception as exc:  # noqa: BLE001 - the next round tries again
        logger.warning("could not send the host's images: %s", exc)
        return message
    return replace(message, images=images)


def heartbeat_loop(client: ConsoleClient, runner: JobRunner, message: Registration, stop: threading.Event) -> None:
    containers = runner.containers
    beats = 0
    while not stop.wait(HEARTBEAT_INTERVAL_S):
        beats += 1
        if containers is not None and beats % IMAGES_EVERY_BEATS == 0:
            message = refresh_images(client, containers, message)
        try:
            reply = client.heartbeat(runner.running())
        except AgentConfigError as exc:
            logger.error("heartbeat refused: %s", exc)
            continue
        except Exception as exc:  # noqa: BLE001 - keep beating; the console marks us down after 30 s
            logger.warning("heartbeat failed: %s", exc)
            continue
        if reply.get("came_back"):
            logger.info("the console had marked this host down; registering again")
            try:
                client.register(replace(message, images=containers.images()) if containers else message)
            except Exception as exc:  # noqa: BLE001
                logger.warning("re-registration failed: %s", exc)
        for job_id, attempt in reply.get("stop", []):
            logger.info("the console no longer runs job %s attempt %s here: stopping it", job_id, attempt)
            runner.stop(job_id, attempt, "the console no longer runs this job on this host")


def celery_app(args: argparse.Namespace, runner: JobRunner) -> Celery:
    app = Celery("gpu-agent", broker=args.broker, set_as_current=True)
    options = {}
    if args.broker.startswith("filesystem"):
        app.conf.broker_transport = FILESYSTEM_TRANSPORT
        folder = str(Path(args.broker_dir).resolve())
        options = {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False,
                   "control_folder": str(Path(folder).parent / "broker-control")}
    app.conf.update(
        broker_transport_options=options or {"visibility_timeout": 3600},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_default_queue=host_queue(args.name),
    )

    @app.task(name=RUN_JOB_TASK)
    def run_job(message: dict[str, Any]) -> str:
        try:
            dispatch = Dispatch.from_message(message)
        except ProtocolError as exc:
            logger.error("ignoring a dispatch this agent cannot read: %s", exc)
            return "refused"
        if dispatch.host != args.name:
            logger.error("ignoring a dispatch for host %s", dispatch.host)
            return "refused"
        return runner.start(dispatch)

    @app.task(name=RESHARE_JOB_TASK)
    def reshare_job(job_id: int, attempt: int, share: float) -> bool:
        return runner.reshare(job_id, attempt, share)

    @app.task(name=STOP_JOB_TASK)
    def stop_job(job_id: int, attempt: int, reason: str, state: str = "stopped") -> bool:
        return runner.stop(job_id, attempt, reason, state="preempted" if state == "preempted" else "stopped")

    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s agent[%(name)s]: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_as = resolve_run_as(args.run_as)
    job_uids = resolve_job_uids(args.job_uids, run_as)
    check_views(run_as, job_uids)
    token = read_token(args)
    backend = open_gpu_backend(args)
    client = ConsoleClient(args.console_url, token)
    work_root = Path(args.work_dir or f"var/agent/{args.name}").resolve()
    artifacts = artifacts_path(args.artifacts).resolve()
    leftovers = kill_leftover_jobs(work_root) if work_root.exists() else []
    if leftovers:
        logger.warning("killed %d job process groups left by a previous run: %s", len(leftovers), leftovers)
    containers = open_container_runtime(args, backend)
    if containers is not None:
        removed = containers.remove_leftovers(args.name)
        if removed:
            logger.warning("removed %d containers left by a previous run: %s", len(removed), ", ".join(removed))

    def attach(job: JobProcess) -> None:
        for index in job.dispatch.gpu_indices:
            assert job.process is not None
            backend.attach_job(index, job.dispatch.job_id, job.process.pid)

    def detach(job: JobProcess) -> None:
        for index in job.dispatch.gpu_indices:
            backend.detach_job(index, job.dispatch.job_id)

    private, masked = hidden_from_jobs(args)
    runner = JobRunner(client, work_root=work_root, artifacts_root=artifacts, console_url=args.console_url,
                       private_paths=private, pass_env=tuple(args.pass_env), mask_paths=masked,
                       simulated=backend.kind == "simulated", grace_s=args.grace_s,
                       on_attach=attach, on_detach=detach,
                       gpus={d.index: (d.uuid, d.memory_mb) for d in backend.devices()},
                       mps=backend.kind == "nvml" and not args.no_mps, address=args.address, run_as=run_as,
                       job_uids=job_uids, containers=containers, volume_roots=tuple(args.volume_root))
    logger.info("job isolation: %s", describe_isolation(run_as, job_uids))
    logger.info("volumes only from below %s", ", ".join(map(str, args.volume_root)) or "(no --volume-root: none)")
    if containers is not None:
        logger.info("jobs that name an image run in %s containers", containers.kind)
    stop = threading.Event()
    message = registration(args, backend, containers, runner.process_isolation)
    try:
        register_until_accepted(client, message, stop)
    except AgentConfigError as exc:
        raise SystemExit(f"gpu-agent: the console refused this agent: {exc}") from None
    threading.Thread(target=heartbeat_loop, args=(client, runner, message, stop), name="heartbeat",
                     daemon=True).start()
    def watch_memory(used: dict[int, int]) -> None:
        for job_id, used_mb, limit_mb in over_share(used, runner.memory_limits()):
            logger.warning("job %s uses %d MiB of GPU memory, over its share of %d MiB: stopping it",
                           job_id, used_mb, limit_mb)
            runner.stop(job_id, None, f"used {used_mb} MiB of GPU memory, over its share of {limit_mb} MiB",
                        state="failed")

    TelemetryLoop(backend, client.telemetry, runner.job_roots, on_memory=watch_memory).start()

    @worker_shutdown.connect(weak=False)
    def _on_shutdown(**_: object) -> None:
        stop.set()
        runner.shutdown()

    app = celery_app(args, runner)
    worker = app.Worker(
        queues=[host_queue(args.name)], pool="threads", concurrency=args.concurrency,
        hostname=f"agent@{args.name}", without_gossip=True, without_mingle=True, without_heartbeat=True,
        loglevel=args.log_level.upper(),
    )
    worker.start()
    sys.exit(worker.exitcode or 0)
