"""The hostile-job checks of test_hostile_jobs*.py, one module per agent set-up (so that pytest-xdist runs the
three set-ups' clusters on different workers at once). Each module gives them a `cluster` fixture of its set-up."""

from __future__ import annotations

import re

from tests.faults.hostile import (
    PIDS_MAX,
    PY,
    HostileCluster,
    attempts,
    check_links_not_followed,
    check_nothing_leaked,
    leak_targets,
    needs_root,
    run_probe,
)
from tests.integration.live import wait_until


@needs_root
def test_a_job_sees_no_secret_of_the_agent_nor_anything_of_another_team(cluster):
    targets = leak_targets(cluster)
    done, log = run_probe(cluster, "env", "--", "read", *targets, "--", "creds", cluster.url, str(cluster.victim["id"]))
    assert done["state"] == "succeeded" and "hostile done" in log, log
    check_nothing_leaked(cluster, log, targets)
    # The console says how the job was isolated, in its record and on its page.
    info = done["runtime_info"]
    assert info["isolation"] == "own-uid" and "uid of its own" in info["isolation_note"]
    page = cluster.browser().get(f"/jobs/{done['id']}/")
    assert "runs under a uid of its own" in page.text


@needs_root
def test_a_job_cannot_swap_its_artifacts_for_links_that_the_console_would_follow(cluster):
    done, log = run_probe(cluster, "swap")
    assert done["state"] == "succeeded", log
    check_links_not_followed(cluster, done, log)


@needs_root
def test_the_jobs_own_work_still_works_progress_checkpoints_artifacts_and_resume_after_preemption(cluster):
    low = cluster.submit_to("red", gpus=3, priority="low", max_steps=100_000,
                            workload={"builtin": "mlp-digits", "params": {"epochs": 10_000, "batch_size": 32}})

    def low_trained_or_settled():  # (a failed or requeued low job ends the wait at once)
        job = cluster.job(low["id"])
        return job if job["steps_done"] >= 30 or job["state"] not in ("queued", "placed", "running") else None

    details = lambda: f"{cluster.board()}\n{cluster.log(low['id'])[-1500:]}"  # noqa: E731 - what held the GPUs
    trained = wait_until(low_trained_or_settled, timeout=300, what="the low job to train", details=details)
    assert trained["state"] == "running" and trained["attempts"] == 1, details()
    urgent = cluster.submit_to("red", gpus=3, priority="urgent", workload={"command": [PY, "-c", "print('urgent')"]})
    assert cluster.wait_state(urgent["id"], {"succeeded", "failed"}, timeout=180)["state"] == "succeeded"
    resumed = cluster.wait_for(lambda: re.search(r"resumed from \S+ \(step (\d+)", cluster.log(low["id"])),
                               timeout=300, what="the low job to resume from its checkpoint")
    assert int(resumed.group(1)) >= 30
    again = cluster.job(low["id"])
    assert again["state"] == "running" and again["attempts"] == 2 and again["preemption_count"] == 1
    files = {a["path"] for a in cluster.admin().get(f"/api/v1/jobs/{low['id']}/artifacts/").json()}
    assert any(path.startswith("checkpoints/") for path in files), files
    assert {"logs/attempt-1-node-0.log"} <= files, files
    cluster.admin().post(f"/api/v1/jobs/{low['id']}/cancel/", json={})
    cluster.wait_state(low["id"], {"cancelled"})


@needs_root
def test_a_fork_bomb_stops_at_the_jobs_process_limit_and_the_host_lives_on(cluster):
    done, log = run_probe(cluster, "forkbomb")
    forks = attempts(log, "fork")
    assert len(forks) == 1 and set(forks.values()) == {"BlockingIOError"}, log  # EAGAIN from pids.max
    children = int(re.search(r"^forkbomb children=(\d+)", log, re.M).group(1))
    assert 0 < children < PIDS_MAX, children
    assert done["state"] == "succeeded" and done["runtime_info"]["limits"]["pids"] == PIDS_MAX
    # Its children went with it; the console and the other team's job did not notice.
    assert cluster.job(cluster.victim["id"])["state"] == "running"
    assert run_probe(cluster, "env")[0]["state"] == "succeeded"


@needs_root
def test_a_job_past_its_memory_limit_fails_with_that_reason(cluster):
    done, log = run_probe(cluster, "hog", "1", memory_gb=0.25)
    assert done["state"] == "failed", log
    assert done["failure_reason"].startswith("out of memory: the job exceeded its memory limit of 0.25 GB"), done
    assert "hog survived" not in log
    assert cluster.job(cluster.victim["id"])["state"] == "running"


@needs_root
def test_replicas_answer_only_the_gateway_and_a_job_that_finds_one_gets_nothing(cluster):
    admin = cluster.admin()
    created = admin.post("/api/v1/services/", json={
        "team": "blue", "name": "digits", "workload": "mlp-digits", "preset": "infer-fp32",
        "min_replicas": 1, "max_replicas": 1})
    assert created.status_code == 201, created.text
    service = created.json()
    try:
        detail = cluster.wait_for(lambda: (d := admin.get(f"/api/v1/services/{service['id']}/").json())["stats"]
                                  .get("ready") and d, timeout=240, what="the replica to be ready")
        replica = cluster.job(detail["replicas"][0]["job"])
        endpoint = replica["runtime_info"]["endpoint"]
        port = int(endpoint.rsplit(":", 1)[1])
        done, log = run_probe(cluster, "replicas", cluster.url)
        assert done["state"] == "succeeded", log
        calls = {target: outcome for target, outcome in attempts(log, "replica").items()
                 if target.split("/")[0].endswith(f":{port}")}
        assert calls, log  # it found the replica's port ...
        for target, outcome in calls.items():  # ... and got nothing from it: no secret, no answer
            assert outcome in ("401", "URLError", "ConnectionRefusedError"), (target, outcome)
        assert any(outcome == "401" for outcome in calls.values()), calls
        # The gateway, which holds the secret, is still served, for team blue's users only.
        inputs = {"inputs": [[0.0] * 64]}
        assert admin.post("/serve/blue/digits/predict", json=inputs).status_code == 200
        assert httpx_anonymous(cluster).post("/serve/blue/digits/predict", json=inputs).status_code == 401
    finally:
        admin.delete(f"/api/v1/services/{service['id']}/")


def httpx_anonymous(cluster: HostileCluster):
    import httpx

    return httpx.Client(base_url=cluster.url, timeout=30)
