"""The hostile-jobs suite against the container backend (issue 16's acceptance): `--runtime podman --oci-runtime
runc`, the probes of scripts/hostile_job.py run in the test image (localhost/gpu-console-test-base:1, built by
tests/containers/images.py), all in one job, next to a victim container job of team blue: what the container
sees of the host (its token, the console's var/, /proc, other jobs' folders, the network), its uid, capabilities
and device nodes, the signals it may send, the links it plants, its process and memory limits.

A module of its own so that CI's workers (--dist loadscope) run it beside test_hostile_jobs.py's set-ups.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.containers import images
from tests.faults.hostile import (
    PIDS_MAX,
    attempts,
    check_links_not_followed,
    check_nothing_leaked,
    hostile_cluster,
    leak_targets,
    needs_root,
    run_probe,
)

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def container_cluster(tmp_path_factory):
    why = images.missing_tools() or (None if os.geteuid() == 0 else "the container backend runs as root")
    if why:
        pytest.skip(f"container backend: {why}")
    images.ensure(images.BASE_IMAGE)
    yield from hostile_cluster("podman", tmp_path_factory.mktemp("hostile-podman"))


# What a container may see of /dev: podman's default nodes, no disk, no GPU it was not given (simulated: none).
CONTAINER_DEVICES = {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "console"}


@needs_root
def test_a_container_job_sees_nothing_of_the_host_holds_no_privilege_and_stays_in_its_limits(container_cluster):
    """Every probe in one job (its start is the slow part): leaks, links, signals, privileges, network, forks,
    and last its memory, past whose limit it fails."""
    cluster = container_cluster
    targets = leak_targets(cluster)
    victim = str(cluster.victim["id"])
    words = ["env", "--", "read", *targets, "--", "creds", cluster.url, victim, "--", "swap", "--", "signal",
             str(cluster.victim_pid), "--", "replicas", cluster.url, "--", "whoami", "--", "forkbomb", "--", "hog", "1"]
    done, log = run_probe(cluster, *words, memory_gb=0.25)
    assert done["state"] == "failed", log
    assert done["failure_reason"].startswith("out of memory: the job exceeded its memory limit of 0.25 GB"), done
    assert "hog survived" not in log and "forkbomb children=" in log, log
    info = done["runtime_info"]
    assert info["backend"] == "podman" and info["isolation"] == "own-uid", info
    check_nothing_leaked(cluster, log, targets)
    check_links_not_followed(cluster, done, log)
    # Its uid is the one the console shows, no account's and not root; no capability, no way to gain one.
    uid, euid = map(int, re.search(r"^whoami uid=(\d+) euid=(\d+)", log, re.M).groups())
    assert uid == euid == info["isolation_uid"] != 0
    status = dict(re.findall(r"^status (\w+)=(\S+)$", log, re.M))
    assert {status[cap] for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}
    assert status["NoNewPrivs"] == "1", status
    privileged = attempts(log, "privileged")
    assert set(privileged) == {"setuid", "mknod", "chroot", "mount"} and "done" not in privileged.values(), log
    assert "written" not in attempts(log, "unlimit").values(), log
    devices = set(re.search(r"^devices ?(.*)$", log, re.M).group(1).split())
    assert devices <= CONTAINER_DEVICES, devices - CONTAINER_DEVICES
    # No network of the host's: only its own loopback, on which no host port listens (the console's, the
    # agent's, a replica's, PostgreSQL's and Redis's are all out of sight).
    assert re.search(r"^interfaces (.*)$", log, re.M).group(1).split() == ["lo"], log
    assert attempts(log, "replica") == {}, log
    # Team blue's process is not in its view, so not to be signalled.
    assert attempts(log, "signal") == {str(cluster.victim_pid): "ProcessLookupError"}, log
    # Its forks stop at its process limit.
    assert set(attempts(log, "fork").values()) == {"BlockingIOError"}, log
    children = int(re.search(r"^forkbomb children=(\d+)", log, re.M).group(1))
    assert 0 < children < PIDS_MAX and info["limits"]["pids"] == PIDS_MAX, (children, info)
    assert cluster.job(cluster.victim["id"])["state"] == "running"
    # Team blue's secret reached its own container (fetched by the agent, not in the dispatch) and is masked in
    # its log as in every other.
    victim_log = cluster.log(cluster.victim["id"])
    assert re.search(r"^victim home=/workspace/code pid=\d+ \*\*\*\*$", victim_log, re.M), victim_log
    own_output = [line for line in victim_log.splitlines() if not line.startswith("[agent]")]  # (not its argv)
    assert own_output and not [line for line in own_output if cluster.victim_secret in line], own_output
