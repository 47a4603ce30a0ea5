"""A live console on the private PostgreSQL and Redis of conftest.py, and the checks every fault test ends with."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import psycopg

from tests.integration.live import LiveCluster, create_team, gone  # noqa: F401 - re-exported for the fault tests

SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable
FINAL = {"succeeded", "failed", "cancelled"}


def start_cluster(base: Path, postgres, redis, agents: dict[str, str]) -> LiveCluster:
    live = LiveCluster(base, agents=agents, extra_env={
        "DATABASE_URL": postgres.url,
        "CELERY_BROKER_URL": f"{redis.url}/0",
        "REDIS_URL": f"{redis.url}/1",
        "CONSOLE_REDISPATCH_AFTER_S": "10",
        # A small pool: the restart tests cut every connection and the console must build them again.
        "CONSOLE_DB_POOL_SIZE": "4",
    })
    live.start()
    admin = live.admin()
    create_team(admin, "it", 16)
    return live


def counted_job(cluster: LiveCluster, seconds: float, **spec) -> dict:
    return cluster.submit(**{"gpus": 1, "workload": {
        "command": [PY, str(SCRIPTS / "counted_run.py"), str(seconds)]}, **spec})


def runs_of(cluster: LiveCluster, job_id: int) -> tuple[int, int]:
    """(starts, completions) that the job's processes wrote down."""
    path = cluster.base / "artifacts" / str(job_id) / "outputs" / "runs.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(line.startswith("start") for line in lines), sum(line.startswith("done") for line in lines)


def job_pid(cluster: LiveCluster, job_id: int, attempt: int = 1) -> int:
    """The pid of the job's process for `attempt`, once that process has written down its start.

    The log keeps earlier attempts' lines, and the job reads "running" as soon as the agent has spawned the
    process, before Python has even started it: waiting for this attempt's own line is what makes a kill
    that follows land on a process that is really running."""
    found = cluster.wait_for(lambda: re.findall(rf"proc pid=(\d+) attempt={attempt}\b", cluster.log(job_id)),
                             timeout=30, what=f"job {job_id}'s process (attempt {attempt}) to start")
    return int(found[-1])


def sql(cluster: LiveCluster, query: str, *params) -> list[tuple]:
    with psycopg.connect(cluster.env["DATABASE_URL"], connect_timeout=5) as conn:
        return conn.execute(query, params).fetchall()


def held_gpus(cluster: LiveCluster, job_id: int) -> int:
    return sql(cluster, "SELECT count(*) FROM jobs_joballocation WHERE job_id = %s AND released_at IS NULL",
               job_id)[0][0]


def assert_ledger_holds(cluster: LiveCluster) -> None:
    """GPUs are held by placed and running jobs only, each holding exactly its GPUs, none shared twice."""
    stray = sql(cluster, """SELECT a.job_id, j.state FROM jobs_joballocation a JOIN jobs_job j ON j.id = a.job_id
                            WHERE a.released_at IS NULL AND j.state NOT IN ('placed', 'running')""")
    assert not stray, f"GPUs held by jobs that are not placed or running: {stray}"
    short = sql(cluster, """SELECT j.id, j.gpus, count(a.id) FROM jobs_job j
                            LEFT JOIN jobs_joballocation a ON a.job_id = j.id AND a.released_at IS NULL
                            WHERE j.state IN ('placed', 'running') GROUP BY j.id, j.gpus
                            HAVING count(a.id) <> j.gpus""")
    assert not short, f"jobs holding the wrong number of GPUs: {short}"
    double = sql(cluster, """SELECT gpu_id, count(*) FROM jobs_joballocation WHERE released_at IS NULL
                             AND share_units >= 100 GROUP BY gpu_id HAVING count(*) > 1""")
    assert not double, f"GPUs given to two jobs: {double}"


def wait_all_final(cluster: LiveCluster, job_ids: list[int], timeout: float) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    jobs: dict[int, dict] = {}
    while time.monotonic() < deadline:
        jobs = {job_id: cluster.job(job_id) for job_id in job_ids}
        if all(job["state"] in FINAL for job in jobs.values()):
            return jobs
        time.sleep(1)
    states = {job_id: (job["state"], job.get("pending_reason")) for job_id, job in jobs.items()}
    raise AssertionError(f"jobs not finished after {timeout:.0f} s: {states}\n{cluster.logs_tail()}")
