"""The hostile-job checks (test_hostile_jobs.py) with the systemd recipe's agent settings."""

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

cluster = hostile_cluster_fixture("systemd")
