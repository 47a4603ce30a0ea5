"""Load-test the inference replica server: dynamic batching against one request per forward pass.

Not a test. For each mode it starts `python -m workers.runtime.serve` (fresh weights of the chosen workload:
the speed of a forward pass does not depend on what the weights learnt), then runs N concurrent clients
(asyncio + httpx, one request in the air each, one input per request by default) for a fixed duration and
prints throughput and client-side latency percentiles, plus the server's own mean batch size.

    python benchmarks/serving.py                                  # batching vs --no-batching, ~1 min
    python benchmarks/serving.py --concurrency 64 --duration 20 --json
    python benchmarks/serving.py --workload cnn-digits --preset infer-int8
    python benchmarks/serving.py --params '{"hidden": 2048, "depth": 4}'   # a forward pass that costs more
    python benchmarks/serving.py --modes batching,batching-nowait,no-batching   # + --max-wait-ms 0
    python benchmarks/serving.py --replicas 2                     # two servers per mode, round-robin
    python benchmarks/serving.py --target http://127.0.0.1:8000/serve/vision/digits/predict --token $TOKEN

--target hits an existing /predict endpoint instead (a replica, or the console gateway with --token,
sent as `Authorization: Bearer <token>`); it measures that endpoint as it is configured (one row).
--replicas N starts N servers per mode and sends the clients' requests round-robin over them: a crude
stand-in for the gateway's load balancing (no gateway hop, no health checks), useful only to see whether a
second process helps on this host (on a 2-core machine, it mostly does not).

Reading the table: req/s counts 200 answers per second of the measured windows (warm-ups left out);
p50/p95/p99 are per request as the client saw them (including its own queueing on a busy CPU); batch is
the mean number of inputs per forward pass on the server(s); srv p50 is the server's own median (body
received to answer sent, last 30 s, worst replica); srv cpu and cli cpu are the servers' and the load
generator's CPU time over wall time (100% = one core busy; when neither is near what the host has, the
time goes to the OS scheduler: a shared, busy host); ms/input is the servers' CPU time per answered input,
so a replica with a core to itself can answer about 1000 / ms/input inputs per second whatever else runs.
The client runs on the same machine as the server(s) and competes with them for the CPU; the modes take
turns over --rounds rounds so drifting background load hits all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_PARAMS = {
    # Wide enough that a forward pass costs about as much as the HTTP handling of a request, as with any
    # model worth serving; the default mlp-digits (256 wide) is reported with --params '{}'.
    "mlp-digits": {"hidden": 1024, "depth": 3},
    "cnn-digits": {"channels": 32},
    "tiny-lm": {"d_model": 128, "layers": 2, "seq_len": 64},
}


def sample_body(workload: str, inputs: int) -> bytes:
    if workload == "tiny-lm":
        return json.dumps({"inputs": ["The keeper "] * inputs, "max_new_tokens": 8}).encode()
    from sklearn.datasets import load_digits

    images = load_digits().data[:inputs].tolist()
    return json.dumps({"inputs": images}).encode()


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    workdir: Path
    port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# mode -> the server flags it adds
MODES: dict[str, list[str]] = {
    "batching": [],
    "no-batching": ["--no-batching"],
    "batching-nowait": ["--max-wait-ms", "0"],  # batches only what queued up during the previous pass
}


def start_server(workdir: Path, args: argparse.Namespace, flags: list[str]) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSOLE_")}
    env.update({"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "CONSOLE_PRESET": args.preset,
                "CONSOLE_PROGRESS_FILE": str(workdir / "progress.jsonl"), "CONSOLE_DEVICE": args.device})
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    params = args.params if args.params is not None else json.dumps(DEFAULT_PARAMS[args.workload])
    command = [sys.executable, "-m", "workers.runtime.serve", "--workload", args.workload, "--params", params,
               "--host", "127.0.0.1", "--port", "0", "--max-batch", str(args.max_batch),
               "--max-wait-ms", str(args.max_wait_ms)]
    command += flags  # later flags win
    with (workdir / "server.log").open("wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    return Server(proc, workdir)


def wait_ready(server: Server, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    progress = server.workdir / "progress.jsonl"
    while time.monotonic() < deadline:
        if progress.exists():
            for line in progress.read_text().splitlines():
                record = json.loads(line)
                if record.get("type") == "serving":
                    server.port = int(record["port"])
                    return
        if server.proc.poll() is not None:
            raise SystemExit(f"server exited with {server.proc.returncode}:\n"
                             f"{(server.workdir / 'server.log').read_text()[-3000:]}")
        time.sleep(0.1)
    raise SystemExit(f"server not ready after {timeout} s")


def stop_server(server: Server) -> int | None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            return server.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


@dataclass
class Load:
    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0  # the client process's CPU seconds


async def generate_load(urls: list[str], body: bytes, *, concurrency: int, duration: float, warmup: float,
                        headers: dict[str, str], start_at: float, offset: int = 0) -> Load:
    """`concurrency` clients, each with one request in the air, round-robin over `urls`; the load starts
    at wall time `start_at` and is measured from `warmup` seconds later, for `duration` seconds."""
    load = Load()
    limits = httpx.Limits(max_connections=len(urls), max_keepalive_connections=len(urls))
    counter = offset
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - time.time()))
    start = loop.time()
    measure_from = start + warmup
    stop_at = measure_from + duration
    async def client_loop() -> None:
        # One httpx client (and keep-alive connection per URL) per simulated client: a single shared pool
        # costs the load generator far more CPU per request at high concurrency.
        nonlocal counter
        async with httpx.AsyncClient(timeout=60, limits=limits,
                                     headers={"content-type": "application/json", **headers}) as client:
            while (sent := loop.time()) < stop_at:
                url = urls[counter % len(urls)]
                counter += 1
                try:
                    response = await client.post(url, content=body)
                    status = str(response.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                done = loop.time()
                if sent < measure_from or done > stop_at:
                    continue
                load.statuses[status] = load.statuses.get(status, 0) + 1
                if status == "200":
                    load.ok += 1
                    load.latencies.append((done - sent) * 1000.0)
                else:
                    load.failed += 1

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    load.cpu_s = time.process_time()
    return load


def _client_process(urls: list[str], body: bytes, concurrency: int, duration: float, warmup: float,
                    headers: dict[str, str], start_at: float, offset: int) -> Load:
    cpu_start = time.process_time()
    load = asyncio.run(generate_load(urls, body, concurrency=concurrency, duration=duration, warmup=warmup,
                                     headers=headers, start_at=start_at, offset=offset))
    load.cpu_s -= cpu_start
    return load


def run_clients(urls: list[str], body: bytes, args: argparse.Namespace, headers: dict[str, str],
                duration: float) -> Load:
    """The load from --client-procs processes together (one process's event loop, and httpx in it, costs
    more CPU per request than a small model's forward pass)."""
    procs = max(1, min(args.client_procs, args.concurrency))
    shares = [args.concurrency // procs + (1 if i < args.concurrency % procs else 0) for i in range(procs)]
    start_at = time.time() + 0.5
    jobs = [(urls, body, share, duration, args.warmup, headers, start_at, i) for i, share in enumerate(shares)]
    if procs == 1:
        loads = [_client_process(*jobs[0])]
    else:
        with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("fork")) as pool:
            loads = list(pool.map(_client_process, *zip(*jobs, strict=True)))
    total = Load()
    for load in loads:
        total.latencies += load.latencies
        total.ok += load.ok
        total.failed += load.failed
        total.cpu_s += load.cpu_s
        for status, count in load.statuses.items():
            total.statuses[status] = total.statuses.get(status, 0) + count
    return total


def server_counters(urls: list[str], headers: dict[str, str]) -> tuple[int, int, float | None] | None:
    """(inputs, batches, the worst replica's p50 ms over its last 30 s) from the replicas' /stats; None when
    they have no /stats (a gateway)."""
    inputs = batches = 0
    p50: float | None = None
    for url in urls:
        try:
            stats = httpx.get(url.rsplit("/predict", 1)[0] + "/stats", headers=headers, timeout=10).json()
            inputs += int(stats["inputs"])
            batches += int(stats["batches"])
            if stats["latency_ms"]["p50"] is not None:
                p50 = max(p50 or 0.0, float(stats["latency_ms"]["p50"]))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
    return inputs, batches, p50


def process_cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of the given processes (and their threads), from /proc; None elsewhere."""
    total = 0.0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return total


@dataclass
class Mode:
    """What one row of the table measures: some servers (or the --target) and the load they got so far."""

    label: str
    urls: list[str]
    pids: list[int] = field(default_factory=list)
    load: Load = field(default_factory=Load)
    seconds: float = 0.0  # measured seconds
    wall_s: float = 0.0  # wall time of the load runs, warm-ups included
    server_cpu_s: float | None = 0.0
    inputs: int | None = 0
    batches: int | None = 0
    server_p50_ms: float | None = None


def measure_round(mode: Mode, body: bytes, args: argparse.Namespace, headers: dict[str, str],
                  duration: float) -> None:
    """Load `mode` for `duration` seconds (after the warm-up) and add what was measured to it."""
    before = server_counters(mode.urls, headers)
    cpu_before = process_cpu_seconds(mode.pids) if mode.pids else None
    wall_start = time.perf_counter()
    load = run_clients(mode.urls, body, args, headers, duration)
    wall = time.perf_counter() - wall_start
    cpu_after = process_cpu_seconds(mode.pids) if mode.pids else None
    after = server_counters(mode.urls, headers)
    total = mode.load
    total.latencies += load.latencies
    total.ok += load.ok
    total.failed += load.failed
    total.cpu_s += load.cpu_s
    for status, count in load.statuses.items():
        total.statuses[status] = total.statuses.get(status, 0) + count
    mode.seconds += duration
    mode.wall_s += wall
    if cpu_before is None or cpu_after is None or mode.server_cpu_s is None:
        mode.server_cpu_s = None
    else:
        mode.server_cpu_s += cpu_after - cpu_before
    if before is None or after is None or mode.inputs is None or mode.batches is None:
        mode.inputs = mode.batches = None
    else:
        mode.inputs += after[0] - before[0]
        mode.batches += after[1] - before[1]
        mode.server_p50_ms = after[2]


def row_of(mode: Mode, args: argparse.Namespace) -> dict[str, Any]:
    load = mode.load
    row: dict[str, Any] = {"mode": mode.label, "replicas": len(mode.urls), "concurrency": args.concurrency,
                           "requests_ok": load.ok, "failed": load.failed, "statuses": load.statuses,
                           "rps": load.ok / mode.seconds if mode.seconds else 0.0,
                           "client_cpu": load.cpu_s / mode.wall_s if mode.wall_s else None}
    if load.latencies:
        p50, p95, p99 = np.percentile(np.asarray(load.latencies), [50, 95, 99])
        row.update({"p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99)})
    if mode.batches:
        # Includes the warm-up periods' requests.
        row["batch_mean"] = mode.inputs / mode.batches
    if mode.server_cpu_s is not None and mode.pids and mode.wall_s:
        row["server_cpu"] = mode.server_cpu_s / mode.wall_s
        if mode.inputs:
            # CPU seconds the servers spent per answered input, warm-ups included: what bounds a replica's
            # throughput once it has the CPU to itself (1000 / this = inputs/s per core).
            row["server_cpu_ms_per_input"] = mode.server_cpu_s * 1000.0 / mode.inputs
    if mode.server_p50_ms is not None:
        row["server_p50_ms"] = mode.server_p50_ms
    return row


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    served = (f"target {args.target}" if args.target else
              f"workload {args.workload} {args.params or json.dumps(DEFAULT_PARAMS[args.workload])}, "
              f"preset {args.preset}, max-batch {args.max_batch}, max-wait {args.max_wait_ms:g} ms")
    print(f"\n{served}; {args.inputs_per_request} input(s)/request, {args.concurrency} concurrent clients in "
          f"{args.client_procs} process(es), {args.duration:g} s in {args.rounds} rounds (+{args.warmup:g} s "
          f"warm-up each), {os.cpu_count()} CPUs")
    header = (f"{'mode':<14}{'replicas':>9}{'req/s':>10}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'batch':>8}"
              f"{'failed':>8}{'srv p50':>9}{'srv cpu':>9}{'ms/input':>9}{'cli cpu':>9}")
    print(header)
    print("-" * len(header))
    def ms(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.1f}" if key in row else "-"

    for row in rows:
        batch = f"{row['batch_mean']:.1f}" if "batch_mean" in row else "-"
        srv_cpu = f"{row['server_cpu']:.0%}" if "server_cpu" in row else "-"
        print(f"{row['mode']:<14}{row['replicas']:>9}{row['rps']:>10.0f}{ms(row, 'p50_ms'):>9}{ms(row, 'p95_ms'):>9}"
              f"{ms(row, 'p99_ms'):>9}{batch:>8}{row['failed']:>8}{ms(row, 'server_p50_ms'):>9}"
              f"{srv_cpu:>9}{ms(row, 'server_cpu_ms_per_input'):>9}{row['client_cpu']:>9.0%}")
    by_mode = {row["mode"]: row for row in rows}
    if "batching" in by_mode and "no-batching" in by_mode and by_mode["no-batching"]["rps"] > 0:
        b, n = by_mode["batching"], by_mode["no-batching"]
        print(f"\nbatching / no-batching: {b['rps'] / n['rps']:.2f}x throughput, p95 "
              f"{b.get('p95_ms', float('nan')):.1f} ms vs {n.get('p95_ms', float('nan')):.1f} ms", end="")
        if b.get("server_cpu_ms_per_input") and n.get("server_cpu_ms_per_input"):
            print(f"; server CPU per input {n['server_cpu_ms_per_input'] / b['server_cpu_ms_per_input']:.2f}x "
                  "less with batching", end="")
        print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mlp-digits", choices=sorted(DEFAULT_PARAMS))
    parser.add_argument("--params", default=None, help="JSON workload params of the served model "
                        "(default: a per-workload size, see DEFAULT_PARAMS)")
    parser.add_argument("--preset", default="infer-fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", default="batching,no-batching", help=f"of {', '.join(MODES)}")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per mode")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    parser.add_argument("--inputs-per-request", type=int, default=1)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="the modes take turns this many times (the duration is split between rounds)")
    parser.add_argument("--client-procs", type=int, default=2,
                        help="load generator processes (the concurrent clients are split between them)")
    parser.add_argument("--replicas", type=int, default=1, help="servers per mode, requests round-robin")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each server")
    parser.add_argument("--target", default=None, help="an existing /predict URL to load instead")
    parser.add_argument("--token", default=None, help="with --target: sent as Authorization: Bearer <token>")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args(argv)

    body = sample_body(args.workload, args.inputs_per_request)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    rows: list[dict[str, Any]] = []
    if args.target:
        target = Mode("target", [args.target])
        for _ in range(args.rounds):
            measure_round(target, body, args, headers, args.duration / args.rounds)
        rows.append(row_of(target, args))
    else:
        labels = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = set(labels) - set(MODES)
        if unknown:
            parser.error(f"unknown modes {', '.join(sorted(unknown))}; expected {', '.join(MODES)}")
        with tempfile.TemporaryDirectory(prefix="serving-bench-") as tmp:
            # Every mode's servers run for the whole benchmark and the modes take turns, round after
            # round: on a shared host the background load drifts, and this spreads it over all of them.
            servers: dict[str, list[Server]] = {
                label: [start_server(Path(tmp) / f"{label}-{i}", args, MODES[label]) for i in range(args.replicas)]
                for label in labels}
            try:
                for group in servers.values():
                    for server in group:
                        wait_ready(server)
                modes = [Mode(label, [f"{s.url}/predict" for s in group], [s.proc.pid for s in group])
                         for label, group in servers.items()]
                for _ in range(args.rounds):
                    for mode in modes:
                        measure_round(mode, body, args, headers, args.duration / args.rounds)
                rows.extend(row_of(mode, args) for mode in modes)
            finally:
                for group in servers.values():
                    for server in group:
                        stop_server(server)
    print_table(rows, args)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
