"""Job submissions under load, through the real REST API, beside a bare row-locked insert endpoint.

    python benchmarks/submit_load.py [--duration 20] [--connections 32] [--workers 3] [--users 48] [--max-steps 300]
        [--json]

Starts a console on loopback against a fresh PostgreSQL database (and Redis as the Celery broker, with a Celery
worker running scheduler passes meanwhile), registers a host with 16 GPUs, and drives both endpoints with wrk
(Debian's `wrk`): `POST /api/v1/bench/bare-insert/` (token auth + one insert under the team's quota row lock:
the ceiling) and `POST /api/v1/jobs/` (token auth, validation, quota and role checks, the per-user rate limit
under the user's row lock, job and event, after-commit pass request). The requests come from --users members of
one team, round robin, as a lab's people and CI pipelines would send them, under the default per-user rate
limit (600 a minute); --users 1 sends them all as one user with the limit lifted. Each job declares
--max-steps steps (as `gpuctl submit --max-steps` does; the submission then reads the user's record of past
declarations and the pass orders the job by its declared size); 0 declares none. Prints requests/s, latency
percentiles and CPU per request of both, the ratio, and checks at the end the quota invariants and that each
user's jobs queue in the order they were submitted.
Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.live import _fresh_postgres, _fresh_redis, free_port  # noqa: E402
from workers.protocol import GpuRecord, Registration  # noqa: E402

PASSWORD = "bench-admin-pass-1234"
SETUP = """
from django.contrib.auth import get_user_model
from apps.accounts.models import Role, Team
from apps.accounts.services import ensure_demo_admin, membership_set, token_create
from apps.quotas.services import quota_ensure
admin, _ = ensure_demo_admin("bencher", "{password}")
team, _ = Team.objects.get_or_create(slug="load", defaults={{"name": "load"}})
quota = quota_ensure(team); quota.max_gpus = 8; quota.may_borrow = False; quota.save()
for number in range({users}):
    user = get_user_model().objects.create_user(f"loader-{{number}}", password=None)
    membership_set(team=team, user=user, role=Role.MEMBER, actor=admin)
    print("TOKEN", token_create(user=user, name="bench")[1])
"""
# Each request takes the next user's token, round robin within each wrk thread.
LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
local tokens = {{{tokens}}}
local turn = 0
request = function()
  turn = turn + 1
  wrk.headers["Authorization"] = "Bearer " .. tokens[turn % #tokens + 1]
  return wrk.format()
end
"""


def _found(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text)
    if match is None:
        raise SystemExit(f"wrk's output has no {pattern!r}:\n{text}")
    return match


def parse_wrk(text: str) -> dict[str, float]:
    def ms(value: str) -> float:
        number, unit = _found(r"([\d.]+)(\w+)", value).groups()
        return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]

    found = {"rps": float(_found(r"Requests/sec:\s+([\d.]+)", text).group(1))}
    for percentile in ("50", "75", "90", "99"):
        match = re.search(rf"\s{percentile}%\s+([\d.]+\w+)", text)
        if match:
            found[f"p{percentile}_ms"] = ms(match.group(1))
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    found["non_2xx"] = int(errors.group(1)) if errors else 0
    found["requests"] = int(_found(r"(\d+) requests in", text).group(1))
    return found


def cpu_seconds() -> dict[str, float]:
    """CPU time used so far by the processes that serve a request, by kind (from /proc: Linux only)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = ("web (uvicorn)" if "uvicorn" in command or "multiprocessing" in command
                else "celery worker" if "celery" in command else "postgres" if command.startswith("postgres")
                else "redis" if command.startswith("redis-server") else None)
        if kind:
            used[kind] = used.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3, help="seconds of load before each measured phase")
    parser.add_argument("--workers", type=int, default=3, help="uvicorn worker processes")
    parser.add_argument("--users", type=int, default=48,
                        help="members of the team who submit, round robin (1: one user, rate limit lifted)")
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-worker", action="store_true",
                        help="no Celery worker: measure the API alone (by default scheduler passes over the growing "
                             "queue run beside it, on the same cores)")
    parser.add_argument("--max-steps", type=int, default=300,
                        help="the steps each job declares (max_steps); 0: none declared")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk: apt-get install wrk")

    base = Path(tempfile.mkdtemp(prefix="submit-load-"))
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "CONSOLE_VAR_DIR": str(base / "var"),
           "DATABASE_URL": _fresh_postgres(args.database, "console_submit_load"),
           "CELERY_BROKER_URL": _fresh_redis(args.redis, 14), "REDIS_URL": _fresh_redis(args.redis, 15),
           "CONSOLE_BENCHMARK_ENDPOINTS": "1",
           # As a deployment runs: DEBUG's query log costs every statement (the real endpoint runs more of them).
           "CONSOLE_LOG_LEVEL": "WARNING", "DJANGO_DEBUG": "0"}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    if args.users == 1:
        env["CONSOLE_SUBMIT_PER_MINUTE"] = "1000000"
    setup = subprocess.run([*manage, "shell", "-c", SETUP.format(password=PASSWORD, users=args.users)], cwd=ROOT,
                           env=env, check=True, capture_output=True, text=True).stdout
    tokens = re.findall(r"TOKEN (\S+)", setup)
    host_token = subprocess.run([*manage, "issue_host_token", "bench-host"], cwd=ROOT, env=env, check=True,
                                capture_output=True, text=True).stdout.strip()
    processes = [
        subprocess.Popen([sys.executable, "-m", "uvicorn", "console.asgi:application", "--port", str(port),
                          "--workers", str(args.workers), "--log-level", "warning", "--no-access-log",
                          "--timeout-keep-alive", "75"],
                         cwd=ROOT, env=env, start_new_session=True),
    ]
    if not args.no_worker:
        processes.append(subprocess.Popen([sys.executable, "-m", "celery", "-A", "console", "worker", "--beat", "--queues", "console",
                          "--concurrency", "1", "--loglevel", "WARNING", "-s", str(base / "beat")],
                         cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{url}/accounts/login/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        # (the protocol's own message, as an agent sends it: the benchmark's hand-written one went stale)
        registration = Registration(
            host="bench-host", agent_version="bench", simulated=True,
            gpus=[GpuRecord(i, f"GPU-bench-{i}", "Simulated NVIDIA H200", "H200", 143771) for i in range(16)],
        ).to_message()
        host_headers = {"Authorization": f"Host {host_token}"}
        httpx.post(f"{url}/api/v1/agent/register/", json=registration, headers=host_headers,
                   timeout=10).raise_for_status()
        # The host's heartbeats, as its agent would send them: without them it is marked down after 30 s and
        # the jobs placed on it are requeued, which would hide what the run left placed.
        beating = threading.Event()

        def heartbeat() -> None:
            while not beating.wait(5):
                with contextlib.suppress(httpx.HTTPError):
                    httpx.post(f"{url}/api/v1/agent/heartbeat/", json={"running": []}, headers=host_headers,
                               timeout=10)

        threading.Thread(target=heartbeat, daemon=True).start()
        results: dict[str, dict[str, float]] = {}
        cpu_ms: dict[str, dict[str, float]] = {}
        declared = {"max_steps": args.max_steps} if args.max_steps > 0 else {}
        job = json.dumps({"name": "load", "team": "load", "gpus": 1, "workload": {"builtin": "mlp-digits"}, **declared})
        for name, path, body in [("bare row-locked insert", "/api/v1/bench/bare-insert/", "{}"),
                                 ("submit (POST /api/v1/jobs/)", "/api/v1/jobs/", job)]:
            script = base / "post.lua"
            script.write_text(LUA.format(tokens=", ".join(f'"{token}"' for token in tokens), body=body))
            wrk = ["wrk", f"-t{min(2, args.connections)}", f"-c{args.connections}", "--latency", "-s", str(script)]
            # Warm-up, not counted: each web worker fills its connection pool and caches first (the first
            # phase's p99 was otherwise the servers' start, not the endpoint), and what the previous phase left
            # queued in the server is served meanwhile.
            subprocess.run([*wrk, f"-d{args.warmup}s", f"{url}{path}"], capture_output=True, check=True)
            time.sleep(3)  # the warm-up's own requests still queued in the server finish before the measurement
            before = cpu_seconds()
            out = subprocess.run([*wrk, f"-d{args.duration}s", f"{url}{path}"], capture_output=True, text=True,
                                 check=True)
            results[name] = parse_wrk(out.stdout)
            after = cpu_seconds()
            cpu_ms[name] = {
                kind: round(1000 * (after[kind] - before.get(kind, 0.0)) / max(results[name]["requests"], 1), 2)
                for kind in after}
        time.sleep(3)  # let the last passes run
        check = subprocess.run([*manage, "shell", "-c", (
            "from django.db.models import Count, Sum, F, Q\n"
            "from apps.jobs.models import Job, JobAllocation\n"
            "held = Job.objects.filter(team__slug='load', state__in=['placed','running'])"
            ".aggregate(u=Sum(F('gpus')*F('gpu_share_units')))['u'] or 0\n"
            "doubled = JobAllocation.objects.filter(released_at__isnull=True, share_units=100).values('gpu')"
            ".annotate(n=Count('id')).filter(n__gt=1).count()\n"
            # Each user's jobs queue in the order they were submitted (one user's submissions are serialised);
            # concurrent submissions of different users have no order to keep.
            "rows = Job.objects.order_by('user_id', 'created_at', 'id').values_list('user_id', 'id')\n"
            "ordered = all(a[1] < b[1] for a, b in zip(rows, rows[1:]) if a[0] == b[0])\n"
            "declaring = Job.objects.filter(max_steps__isnull=False).count()\n"
            "print('CHECK', Job.objects.count(), held / 100, doubled, ordered, declaring)")],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
        jobs, held, doubled, ordered, declaring = _found(r"CHECK (\d+) ([\d.]+) (\d+) (\w+) (\d+)", check).groups()
    finally:
        with contextlib.suppress(NameError):
            beating.set()
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for process in processes:
            process.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)

    bare, real = results["bare row-locked insert"], results["submit (POST /api/v1/jobs/)"]
    reported = {name: {**row, "cpu_ms_per_request": cpu_ms[name]} for name, row in results.items()}
    ratio = real["rps"] / bare["rps"]
    summary = {"results": reported, "ratio": ratio, "jobs": int(jobs), "gpus_held": float(held),
               "double_booked_gpus": int(doubled), "queue_order_consistent": ordered == "True",
               "max_steps": args.max_steps, "jobs_declaring_steps": int(declaring),
               "connections": args.connections, "workers": args.workers, "users": args.users,
               "duration_s": args.duration,
               "scheduler_worker": not args.no_worker}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{'endpoint':30} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'non-2xx':>8}")
    for name, row in results.items():
        print(f"{name:30} {row['rps']:8.1f} {row.get('p50_ms', 0):8.1f} {row.get('p90_ms', 0):8.1f} "
              f"{row.get('p99_ms', 0):8.1f} {row['non_2xx']:8.0f}")
    for name, cpu in cpu_ms.items():
        print(f"  CPU per request, {name}: {sum(cpu.values()):.1f} ms ("
              + ", ".join(f"{kind} {ms:.1f}" for kind, ms in sorted(cpu.items())) + ")")
    print(f"{args.connections} connections, {args.workers} web workers, {args.users} users, "
          f"max_steps {args.max_steps or 'none'}, scheduler worker {'on' if not args.no_worker else 'off'}")
    print(f"submit / bare throughput: {ratio:.2f}x (target ≥ 0.8x, p99 < 250 ms)")
    print(f"after the run: {jobs} jobs, team holds {held} of 8 GPUs, {doubled} GPUs double-booked, "
          f"each user's jobs in submission order: {ordered}; {declaring} of them declare max_steps "
          f"({args.max_steps or 'none asked'})")


if __name__ == "__main__":
    main()
