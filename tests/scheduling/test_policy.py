from dataclasses import replace

import pytest

from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.types import Priority, TeamQuotaView

from .helpers import hosts, pending, running, snapshot

HIGH, LOW, NORMAL, URGENT = Priority.HIGH, Priority.LOW, Priority.NORMAL, Priority.URGENT
# Isolates quota and priority rules from shortest-first preemption within a team.
NO_SRPT = PolicyConfig(srpt_preemption=False)


def placed(decisions):
    return {p.job_id: p for p in decisions.placements}


def stopped(decisions):
    return {p.job_id: p.reason for p in decisions.preemptions}


def test_places_by_priority_then_shortest_predicted_service():
    snap = snapshot(
        hosts(1, 2),
        [
            pending(1, declared_steps=1000, observed_step_s=10.0),  # 10,000 s
            pending(2, declared_steps=10, observed_step_s=10.0),  # 100 s
            pending(3, priority=LOW, declared_steps=1, observed_step_s=1.0),
            pending(4, priority=HIGH, declared_steps=10_000, observed_step_s=10.0),
        ],
    )
    decisions = schedule(snap)
    assert set(placed(decisions)) == {4, 2}
    assert decisions.pending[1].position == 1 and decisions.pending[3].position == 2
    assert decisions.pending[1].estimated_start is not None


def test_higher_class_preempts_lower_class_of_its_team_after_minimum_run_time():
    now = 100_000.0
    old_low = running(10, (0, 1), priority=LOW, started_at=now - 3600)
    snap = snapshot(hosts(1, 2), [pending(1, 2, priority=HIGH)], [old_low], now=now)
    decisions = schedule(snap)
    assert "higher-priority job 1" in stopped(decisions)[10]
    assert placed(decisions)[1].gpu_ids == (0, 1)

    young_low = replace(old_low, started_at=now - 60)
    decisions = schedule(replace(snap, running=(young_low,)))
    assert not decisions.preemptions and not decisions.placements

    # A job preempted often is protected longer each time it starts (10 min doubled per preemption past
    # max_preemptions_per_job: 8 -> 6 h at most), never for good.
    often = replace(old_low, preemption_count=8)
    assert not schedule(replace(snap, running=(often,))).preemptions
    assert schedule(replace(snap, running=(replace(often, started_at=now - 6 * 3600),))).preemptions
    assert not schedule(replace(snap, running=(replace(old_low, preemptible=False),))).preemptions


def test_priority_preemption_disabled_by_config():
    snap = snapshot(hosts(1, 2), [pending(1, 2, priority=URGENT)], [running(10, (0, 1), priority=LOW)])
    assert schedule(snap, PolicyConfig(priority_preemption=False)).preemptions == ()


def test_other_teams_within_quota_are_not_preempted_for_priority():
    quotas = {"a": TeamQuotaView("a", 2), "b": TeamQuotaView("b", 2)}
    snap = snapshot(
        hosts(1, 4),
        [pending(1, 2, team="a", priority=URGENT)],
        [running(10, (0, 1), team="b", priority=LOW), running(11, (2, 3), team="a", priority=URGENT)],
        quotas,
    )
    decisions = schedule(snap, NO_SRPT)
    assert not decisions.preemptions
    assert decisions.pending[1].code == "waiting"


def test_borrowing_idle_gpus_and_reclaim_by_the_owner():
    quotas = {"a": TeamQuotaView("a", 2), "b": TeamQuotaView("b", 2, may_borrow=True)}
    snap = snapshot(hosts(1, 4), [pending(1, 4, team="b")], [], quotas)
    decisions = schedule(snap)
    assert placed(decisions)[1].borrowing is True

    borrower = running(10, (0, 1, 2, 3), team="b", borrowing=True, started_at=snap.now - 1)
    owner = pending(2, 2, team="a", priority=LOW)
    decisions = schedule(replace(snap, pending=(owner,), running=(borrower,)))
    assert "reclaimed" in stopped(decisions)[10]
    assert placed(decisions)[2].borrowing is False


def test_team_without_borrowing_waits_at_its_quota():
    quotas = {"a": TeamQuotaView("a", 2)}
    snap = snapshot(hosts(1, 4), [pending(1, 2, team="a")], [running(10, (0, 1), team="a")], quotas)
    info = schedule(snap, NO_SRPT).pending[1]
    assert info.code == "quota" and "2 of its 2 GPUs" in info.reason
    # Its own team's job ends first: 4 h predicted (the default), run 100,000 s, so a quarter of that more.
    assert info.estimated_start == pytest.approx(100_000.0 + 25_000.0)


def test_user_cap_inside_a_team():
    quotas = {"t": TeamQuotaView("t", 8, user_max_gpus={"u": 1})}
    snap = snapshot(hosts(1, 4), [pending(1, 1), pending(2, 1)], [], quotas)
    decisions = schedule(snap)
    assert len(decisions.placements) == 1 and decisions.pending[2].code == "user_cap"


def test_reasons_for_gpu_type_size_and_gang():
    snap = snapshot(
        hosts(2, 4),
        [pending(1, 1, gpu_type="h100"), pending(2, 16), pending(3, 4)],
        [running(10, (0, 1), started_at=99_940.0), running(11, (4, 5), started_at=99_940.0)],
    )
    info = schedule(snap).pending
    assert info[1].code == "no_gpu_type" and "h100" in info[1].reason
    assert info[2].code == "too_large"
    assert info[3].code == "gang" and "at most 2 on one host" in info[3].reason


def test_unschedulable_gpus_receive_no_new_jobs():
    host_views = hosts(1, 2)
    sick = replace(
        host_views[0], gpus=(replace(host_views[0].gpus[0], schedulable=False), host_views[0].gpus[1])
    )
    decisions = schedule(snapshot((sick,), [pending(1), pending(2)]))
    assert [p.gpu_ids for p in decisions.placements] == [(1,)]


def test_backfill_only_when_the_head_is_not_delayed():
    config = PolicyConfig(policy="fifo-backfill")
    now = 100_000.0
    # h0: GPUs 0-3, two busy until now+1000 (predicted). The 4-GPU head must wait for them.
    busy = running(
        10, (0, 1), declared_steps=1000, observed_step_s=1.0, started_at=now, steps_reported_at=now
    )
    head = pending(1, 4, submitted_at=1.0)
    long_small = pending(2, 2, submitted_at=2.0, declared_steps=5000, observed_step_s=1.0)
    short_small = pending(3, 2, submitted_at=3.0, declared_steps=100, observed_step_s=1.0)
    snap = snapshot(hosts(1, 4), [head, long_small, short_small], [busy], now=now)
    decisions = schedule(snap, config)
    assert set(placed(decisions)) == {3}
    assert decisions.pending[1].code == "reserved"
    assert decisions.pending[1].estimated_start == pytest.approx(now + 1000)
    assert decisions.pending[2].code == "backfill" and "reserved for job 1" in decisions.pending[2].reason


def test_shortest_remaining_preemption_within_team_and_class():
    now = 100_000.0
    long_running = running(10, (0,), declared_steps=100_000, observed_step_s=1.0, started_at=now - 3600)
    short = pending(1, 1, declared_steps=60, observed_step_s=1.0)
    snap = snapshot(hosts(1, 1), [short], [long_running], now=now)
    assert 10 in stopped(schedule(snap))
    assert schedule(snap, PolicyConfig(srpt_preemption=False)).preemptions == ()


@pytest.mark.parametrize(("gang_gpus", "config", "stops"), [
    (4, PolicyConfig(), True),  # 4x as wide: stopped for a declared size any smaller (1.2x here)
    (4, PolicyConfig(gang_preempt_width=0), False),  # the rule off: 1.5x smaller needed
    (2, PolicyConfig(), False),  # 2x as wide only: 1.5x smaller needed
])
def test_a_wide_declared_gang_stops_narrow_declared_jobs_for_any_smaller_size(gang_gpus, config, stops):
    """One-GPU jobs declaring 10,000 steps (one a second, an hour run: valued at their whole size, 10,000
    GPU-seconds) fill the host; a gang declaring 8,000 GPU-seconds of steps waits. 1.2x shorter is not the 1.5x
    that shortest-first preemption asks, but a gang 4x as wide as its victims stops them (shorter_ratio)."""
    now = 100_000.0
    victims = [
        running(10 + i, (i,), declared_steps=10_000, observed_step_s=1.0, started_at=now - 3600,
                submitted_at=now - 3600)
        for i in range(gang_gpus)
    ]
    gang = pending(1, gang_gpus, declared_steps=8_000 // gang_gpus, observed_step_s=1.0, submitted_at=now - 10)
    decisions = schedule(snapshot(hosts(1, gang_gpus), [gang], victims, now=now), config)
    assert set(stopped(decisions)) == ({10 + i for i in range(gang_gpus)} if stops else set())
    assert all("a much wider gang whose declared size is smaller" in why for why in stopped(decisions).values())


def test_fifo_policy_is_the_first_come_first_served_pass():
    snap = snapshot(hosts(1, 1), [pending(2, submitted_at=5.0), pending(1, submitted_at=9.0)])
    assert [p.job_id for p in schedule(snap, PolicyConfig(policy="fifo")).placements] == [2]
    with pytest.raises(ValueError):
        schedule(snap, PolicyConfig(policy="nope"))


def test_deterministic_for_a_snapshot():
    snap = snapshot(
        hosts(2, 4),
        [pending(i, gpus=1 + i % 3, priority=Priority(i % 4), submitted_at=float(i % 5)) for i in range(30)],
        [running(100, (0, 1), priority=LOW)],
    )
    first = schedule(snap)
    assert all(schedule(snap) == first for _ in range(3))


def _replica(job_id: int, gpu: int, now: float, **kw):
    kw.setdefault("started_at", now - 3600)
    return running(job_id, (gpu,), service_group="service:7", **kw)


def test_a_services_only_replica_is_not_stopped_for_a_short_job_of_its_class():
    now = 100_000.0
    short = pending(1, 1, declared_steps=30, observed_step_s=1.0)
    snap = snapshot(hosts(1, 1), [short], [_replica(10, 0, now)], now=now)
    assert schedule(snap).preemptions == ()
    # One of two running replicas may go: the other keeps answering.
    two = snapshot(hosts(1, 2), [pending(1, 2, declared_steps=30, observed_step_s=1.0), pending(2, 1,
                   declared_steps=30, observed_step_s=1.0)], [_replica(10, 0, now), _replica(11, 1, now)], now=now)
    assert len(schedule(two).preemptions) == 1


def test_a_replica_not_serving_yet_keeps_the_only_serving_one():
    now = 100_000.0
    snap = snapshot(hosts(1, 2), [pending(1, 1, declared_steps=30, observed_step_s=1.0)],
                    [_replica(10, 0, now), _replica(11, 1, now, started=False)], now=now)
    assert set(stopped(schedule(snap))) == {11}


def test_a_higher_class_may_still_take_a_services_only_replica():
    now = 100_000.0
    urgent = pending(1, 1, priority=HIGH, declared_steps=30, observed_step_s=1.0)
    snap = snapshot(hosts(1, 1), [urgent], [_replica(10, 0, now)], now=now)
    assert set(stopped(schedule(snap))) == {10}


def test_still_needed_rechecks_a_preemption_on_a_fresh_snapshot():
    from apps.scheduling.preemption import still_needed

    config = PolicyConfig()
    full = snapshot(hosts(2, 4), [pending(9, gpus=4)], [running(1, (0, 1, 2, 3)), running(2, (4, 5, 6, 7))],
                    quotas={"t": TeamQuotaView("t", 16)})
    assert still_needed(full, 9, (), config)
    one_ended = snapshot(hosts(2, 4), [pending(9, gpus=4)], [running(1, (0, 1, 2, 3))],
                         quotas={"t": TeamQuotaView("t", 16)})
    assert not still_needed(one_ended, 9, (), config)
    assert still_needed(one_ended, 9, (4,), config)  # a placement of the same pass was given one of them
    assert not still_needed(one_ended, 99, (), config)  # no longer waiting
    quota_bound = snapshot(hosts(2, 4), [pending(9, gpus=4)], [running(1, (0, 1, 2, 3))],
                           quotas={"t": TeamQuotaView("t", 4)})
    assert still_needed(quota_bound, 9, (), config)  # the GPUs are there, the team's quota is not
