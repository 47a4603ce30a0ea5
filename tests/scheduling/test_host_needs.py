"""Jobs with an image go only to hosts that run containers (podman or docker); jobs given secrets without an image
only to hosts that run each job under a uid of its own; other jobs go anywhere (apps/scheduling/host_needs.py)."""

from __future__ import annotations

import pytest

from apps.scheduling.config import PolicyConfig
from apps.scheduling.placeability import Candidate, candidates, gpu_index, placement_refusal
from apps.scheduling.policy import schedule
from apps.scheduling.types import GpuView, HostView, Priority, TeamQuotaView
from tests.scheduling.helpers import pending, running, snapshot

POLICIES = ["console", "fifo", "fifo-backfill", "fair-share"]


def cluster(container_hosts: set[str], per_host: int = 4, names: tuple[str, ...] = ("p1", "c1", "p2", "c2"),
            own_uid_hosts: frozenset[str] = frozenset()):
    return tuple(
        HostView(name, tuple(GpuView(h * per_host + i, i, "a100") for i in range(per_host)),
                 runs_containers=name in container_hosts, own_uid_jobs=name in own_uid_hosts)
        for h, name in enumerate(names)
    )


def host_of(hosts, gpu_id: int) -> str:
    return gpu_index(hosts)[gpu_id][0].name


def test_the_rule_refuses_a_host_without_containers_for_an_image_only():
    gpu = GpuView(0, 0, "a100")
    plain, box = HostView("p1", (gpu,)), HostView("c1", (gpu,), runs_containers=True)
    assert "its host runs no containers" in placement_refusal(
        pending(1, needs_containers=True), [Candidate(gpu, "p1", host_view=plain)], 100)
    assert placement_refusal(pending(1, needs_containers=True), [Candidate(gpu, "c1", host_view=box)], 100) is None
    assert placement_refusal(pending(1), [Candidate(gpu, "p1", host_view=plain)], 100) is None
    assert "its host runs no containers" in placement_refusal(pending(1, needs_containers=True), [Candidate(gpu)], 100)
    hosts = cluster({"c1"})
    [offered] = candidates([4], gpu_index(hosts), {})
    assert offered.host == "c1" and offered.host_view is not None and offered.host_view.runs_containers


def test_the_rule_refuses_a_host_that_shares_its_jobs_uid_for_a_job_with_secrets_only():
    gpu = GpuView(0, 0, "a100")
    shared, own = HostView("p1", (gpu,), runs_containers=True), HostView("u1", (gpu,), own_uid_jobs=True)
    assert "does not run each job under a uid of its own" in placement_refusal(
        pending(1, needs_own_uid=True), [Candidate(gpu, "p1", host_view=shared)], 100)
    assert placement_refusal(pending(1, needs_own_uid=True), [Candidate(gpu, "u1", host_view=own)], 100) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_jobs_with_secrets_and_no_image_land_on_own_uid_hosts_or_wait_saying_why(policy):
    hosts = cluster({"c1"}, own_uid_hosts=frozenset({"p2"}))
    jobs = [pending(1, gpus=2, needs_own_uid=True), pending(2, gpus=1, needs_own_uid=True, gpu_share=0.5),
            pending(3, gpus=4, needs_own_uid=True), pending(4, gpus=4)]
    decisions = schedule(snapshot(hosts, jobs), PolicyConfig(policy=policy))
    placed = {p.job_id: {host_of(hosts, g) for g in p.gpu_ids} for p in decisions.placements}
    assert {1, 2} <= set(placed) and placed[1] == placed[2] == {"p2"}, (policy, placed)
    assert 3 not in placed and decisions.pending[3].code != "no_runtime"  # p2 is busy: it waits for it
    wide = schedule(snapshot(hosts, [pending(5, gpus=6, needs_own_uid=True)]), PolicyConfig(policy=policy))
    if policy == "console":
        assert "the hosts that run each job under a uid of its own have 4" in wide.pending[5].reason
    nowhere = schedule(snapshot(cluster({"c1"}), [pending(6, needs_own_uid=True)]), PolicyConfig(policy=policy))
    assert nowhere.placements == () and nowhere.pending[6].code == "no_runtime"
    assert "needs an agent run as root with --job-uids" in nowhere.pending[6].reason


@pytest.mark.parametrize("policy", POLICIES)
def test_image_jobs_land_on_container_hosts_and_others_anywhere(policy):
    hosts = cluster({"c1", "c2"})
    jobs = [pending(1, gpus=2, needs_containers=True), pending(2, gpus=4, needs_containers=True),
            pending(3, gpus=1, needs_containers=True, gpu_share=0.5), pending(4, gpus=4), pending(5, gpus=4)]
    decisions = schedule(snapshot(hosts, jobs), PolicyConfig(policy=policy))
    placed = {p.job_id: {host_of(hosts, g) for g in p.gpu_ids} for p in decisions.placements}
    for job_id in (1, 2, 3):
        if job_id in placed:
            assert placed[job_id] <= {"c1", "c2"}, (policy, placed)
    assert {1, 2} <= set(placed), (policy, placed, decisions.pending)
    # Every decision passes the core's rule (what the console's placement and the simulator ask).
    used: dict[int, int] = {}
    for p in decisions.placements:
        job = next(j for j in jobs if j.job_id == p.job_id)
        units = round(p.gpu_share * 100)
        offered = candidates(p.gpu_ids, gpu_index(hosts), used)
        assert placement_refusal(job, offered, units) is None
        for g in p.gpu_ids:
            used[g] = used.get(g, 0) + units


@pytest.mark.parametrize("policy", POLICIES)
def test_without_a_container_host_the_reason_says_so(policy):
    hosts = cluster(set())
    decisions = schedule(snapshot(hosts, [pending(1, needs_containers=True), pending(2)]), PolicyConfig(policy=policy))
    assert [p.job_id for p in decisions.placements] == [2]
    info = decisions.pending[1]
    assert "no host runs containers" in info.reason and info.code == "no_runtime"
    assert info.estimated_start is None


def test_a_container_host_that_is_down_counts_for_none():
    hosts = tuple(HostView(h.name, h.gpus, schedulable=h.name != "c1", runs_containers=h.runs_containers)
                  for h in cluster({"c1"}))
    decisions = schedule(snapshot(hosts, [pending(1, needs_containers=True)]))
    assert "no host runs containers" in decisions.pending[1].reason


def test_a_gang_wider_than_the_container_hosts_is_too_large():
    decisions = schedule(snapshot(cluster({"c1"}), [pending(1, gpus=6, needs_containers=True)]))
    info = decisions.pending[1]
    assert info.code == "too_large" and "the hosts that run containers have 4" in info.reason


def test_a_gang_spans_container_hosts_only():
    hosts = cluster({"c1", "c2"})
    decisions = schedule(snapshot(hosts, [pending(1, gpus=8, needs_containers=True)]))
    [placement] = decisions.placements
    assert {host_of(hosts, g) for g in placement.gpu_ids} == {"c1", "c2"}


def test_a_busy_container_host_makes_an_image_job_wait_though_other_hosts_are_free():
    hosts = cluster({"c1"})
    busy = running(10, (4, 5, 6, 7), started_at=99_900.0)  # too recent to be preempted
    decisions = schedule(snapshot(hosts, [pending(1, needs_containers=True)], [busy]))
    assert decisions.placements == () and decisions.pending[1].code != "no_runtime"


def test_preemption_for_an_image_job_stops_a_job_on_a_container_host():
    hosts = cluster({"c1"}, names=("p1", "c1"))
    low_p = running(10, (0, 1, 2, 3), priority=Priority.LOW, started_at=0.0)
    low_c = running(11, (4, 5, 6, 7), priority=Priority.LOW, started_at=0.0)
    quotas = {"t": TeamQuotaView("t", 8)}
    job = pending(1, gpus=4, priority=Priority.HIGH, needs_containers=True)
    decisions = schedule(snapshot(hosts, [job], [low_p, low_c], quotas=quotas))
    assert [p.job_id for p in decisions.preemptions] == [11]
    [placement] = decisions.placements
    assert {host_of(hosts, g) for g in placement.gpu_ids} == {"c1"}
