"""Hostile jobs, run by the real agent of a real console: a job of team red tries to read the agent's environment,
token and state, the console's database and broker, team blue's folders, logs and artifacts; tries every
credential it finds against the agent and user APIs; swaps its artifact folder for a link; calls replicas
directly; forks without end; allocates past its memory limit. Every attempt fails, nothing of team blue leaks, and
the job's own work (progress, checkpoints, artifacts, resume after preemption) still works.

The checks (tests/faults/hostile_job_checks.py) run in three agent set-ups, a module each:
- `make-run` (this module): `make run`'s defaults (a root agent without options: a uid of its own per job;
  `--private var`);
- `run-as` (test_hostile_jobs_run_as.py): `--run-as nobody --job-uids FIRST-LAST`;
- `systemd` (test_hostile_jobs_systemd.py): the systemd recipe's agent settings (gpu-agent.env.example: options as
  GPU_AGENT_* variables, the token in a root-only folder, work dir and artifact store outside the console's
  state), with PostgreSQL and Redis when the environment names them (CI).
The agent must run as root to switch users: the modules skip otherwise.

The same probes run in a container (the podman set-up) in test_hostile_containers.py. The cluster, the set-ups and
the probes are tests/faults/hostile.py's.
"""

from __future__ import annotations

import pytest

from tests.faults.hostile import hostile_cluster_fixture
from tests.faults.hostile_job_checks import (  # noqa: F401 - the checks, collected here in this set-up
    test_a_fork_bomb_stops_at_the_jobs_process_limit_and_the_host_lives_on,
    test_a_job_cannot_swap_its_artifacts_for_links_that_the_console_would_follow,
    test_a_job_past_its_memory_limit_fails_with_that_reason,
    test_a_job_sees_no_secret_of_the_agent_nor_anything_of_another_team,
    test_replicas_answer_only_the_gateway_and_a_job_that_finds_one_gets_nothing,
    test_the_jobs_own_work_still_works_progress_checkpoints_artifacts_and_resume_after_preemption,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]

cluster = hostile_cluster_fixture("make-run")
