"""Fractions of a GPU in one pass: packing, exact accounting, memory, the fence for whole-GPU jobs, preemption."""

from collections import Counter
from dataclasses import replace

from apps.scheduling.config import PolicyConfig
from apps.scheduling.policy import schedule
from apps.scheduling.sharing import fmt_gpus, share_units, units_on
from apps.scheduling.types import GpuView, HostView, Priority, TeamQuotaView

from .helpers import hosts, pending, running, snapshot

NO_SRPT = PolicyConfig(srpt_preemption=False)


def frac(job_id: int, share: float, **kw):
    return pending(job_id, 1, gpu_share=share, **kw)


def frac_running(job_id: int, gpu: int, share: float, **kw):
    return running(job_id, (gpu,), gpu_share=share, **kw)


def placed(decisions):
    return {p.job_id: p for p in decisions.placements}


def load(decisions, running_jobs=()) -> Counter:
    units: Counter = Counter()
    for job in running_jobs:
        units[job.gpu_ids[0]] += share_units(job.gpu_share)
    for p in decisions.placements:
        for gpu in p.gpu_ids:
            units[gpu] += share_units(p.gpu_share)
    return units


def test_units_are_exact():
    assert share_units(0.1 + 0.2) == 30 and share_units(0.29) == 29 and share_units(1 / 3) == 33
    assert fmt_gpus(100) == "1" and fmt_gpus(125) == "1.25" and fmt_gpus(50) == "0.5"
    job = pending(1, gpu_memory_mb=20_000)
    assert units_on(job, 80_000) == 25 and units_on(job, 16_000) is None and units_on(job, 0) == 100
    assert units_on(replace(job, gpu_share=0.5), 80_000) == 50


def test_four_quarters_share_one_gpu_and_a_fifth_opens_another():
    decisions = schedule(snapshot(hosts(1, 2), [frac(i, 0.25) for i in range(1, 6)]))
    gpus = Counter(p.gpu_ids for p in decisions.placements)
    assert sorted(gpus.values()) == [1, 4] and len(decisions.placements) == 5
    assert all(p.gpu_share == 0.25 for p in decisions.placements)


def test_a_fifth_quarter_waits_when_no_gpu_has_room():
    decisions = schedule(snapshot(hosts(1, 1), [frac(i, 0.25) for i in range(1, 6)]))
    assert len(decisions.placements) == 4 and set(decisions.pending) == {5}
    assert decisions.pending[5].code == "waiting"


def test_halves_and_a_quarter_never_exceed_one_gpu():
    jobs = [frac(1, 0.5), frac(2, 0.5), frac(3, 0.25)]
    one = schedule(snapshot(hosts(1, 1), jobs))
    assert len(one.placements) == 2 and max(load(one).values()) <= 100
    two = schedule(snapshot(hosts(1, 2), jobs))
    assert len(two.placements) == 3 and max(load(two).values()) <= 100


def test_fractions_pack_best_fit_onto_shared_gpus_first():
    # GPU 0 has 0.5 free, GPU 1 has 0.25 free, GPUs 2-3 are idle: a quarter goes to GPU 1, a half to GPU 0.
    busy = [frac_running(10, 0, 0.5), frac_running(11, 1, 0.75)]
    decisions = schedule(snapshot(hosts(1, 4), [frac(1, 0.25), frac(2, 0.5)], busy))
    assert placed(decisions)[1].gpu_ids == (1,) and placed(decisions)[2].gpu_ids == (0,)


def test_a_new_fraction_opens_a_gpu_on_a_host_that_already_shares():
    # h0 is idle (4 free); h1 has a full shared GPU and 3 free: the new fraction goes to h1.
    busy = [frac_running(10, 4, 0.5), frac_running(11, 4, 0.5)]
    decisions = schedule(snapshot(hosts(2, 4), [frac(1, 0.5)], busy))
    assert placed(decisions)[1].gpu_ids[0] in (5, 6, 7)


def test_quota_counts_four_quarters_as_one_gpu():
    quotas = {"t": TeamQuotaView("t", 1)}
    decisions = schedule(snapshot(hosts(1, 4), [frac(i, 0.25) for i in range(1, 6)], quotas=quotas), NO_SRPT)
    assert len(decisions.placements) == 4
    assert decisions.pending[5].code == "quota" and "1 of its 1 GPUs" in decisions.pending[5].reason
    held = [frac_running(10 + i, 0, 0.25) for i in range(3)]
    decisions = schedule(snapshot(hosts(1, 4), [pending(1, 1)], held, quotas=quotas), NO_SRPT)
    assert "0.75 of its 1 GPUs" in decisions.pending[1].reason
    decisions = schedule(snapshot(hosts(1, 4), [pending(1, 1), frac(2, 0.25)], held, quotas=quotas), NO_SRPT)
    assert set(placed(decisions)) == {2}  # 0.75 held: a whole GPU is over quota, a quarter is not


def test_memory_requests_share_by_memory():
    gpus = (HostView("h", (GpuView(0, 0, "x", memory_mb=40_000), GpuView(1, 1, "x", memory_mb=40_000))),)
    jobs = [pending(i, 1, gpu_memory_mb=15_000) for i in range(1, 6)] + [pending(9, 1, gpu_memory_mb=50_000)]
    decisions = schedule(snapshot(gpus, jobs))
    assert len(decisions.placements) == 4 and all(p.gpu_share == 0.38 for p in decisions.placements)
    assert max(load(decisions).values()) <= 100
    assert decisions.pending[9].code == "too_large"


def test_whole_jobs_never_go_on_a_partly_used_gpu():
    # (started a minute ago: inside its minimum run time, no waiting job of its class may stop it)
    busy = [frac_running(10, 0, 0.25, started_at=99_940.0)]
    decisions = schedule(snapshot(hosts(1, 2), [pending(1, 1), pending(2, 1)], busy))
    assert [p.gpu_ids for p in decisions.placements] == [(1,)]
    decisions = schedule(snapshot(hosts(1, 2), [pending(1, 2)], busy))
    assert not decisions.placements and decisions.pending[1].code in ("waiting", "gang")


def test_fractions_do_not_take_gpus_a_blocked_whole_job_needs():
    # A 2-GPU job waits only because a quarter holds GPU 0 (inside its minimum run time): new fractions may not use
    # GPU 0 or GPU 1.
    busy = [frac_running(10, 0, 0.25, started_at=99_940.0)]
    whole = pending(1, 2, submitted_at=1.0)
    fractions = [frac(2, 0.25, submitted_at=2.0, declared_steps=10, observed_step_s=1.0)]
    quotas = {"t": TeamQuotaView("t", 8)}
    decisions = schedule(snapshot(hosts(1, 2), [whole, *fractions], busy, quotas))
    assert not decisions.placements
    assert "kept for whole-GPU job 1" in decisions.pending[2].reason
    # A GPU of another host is free for fractions (the whole job cannot use it): they go there.
    other = running(11, (2,), declared_steps=10**6, observed_step_s=1.0)
    decisions = schedule(snapshot(hosts(2, 2), [whole, *fractions], [*busy, other], quotas))
    assert placed(decisions).keys() == {2} and placed(decisions)[2].gpu_ids == (3,)
    # A higher-priority fraction is not held back by a lower-priority whole job.
    urgent = [replace(fractions[0], priority=Priority.HIGH)]
    assert set(placed(schedule(snapshot(hosts(1, 2), [whole, *urgent], busy, quotas)))) == {2}


def test_fractions_on_a_gpu_are_preempted_together_for_a_higher_class():
    now = 100_000.0
    low = [frac_running(10 + i, 0, 0.5, priority=Priority.LOW, started_at=now - 3600) for i in range(2)]
    other = frac_running(20, 1, 0.5, priority=Priority.HIGH, started_at=now - 3600)
    snap = snapshot(hosts(1, 2), [pending(1, 1, priority=Priority.HIGH)], [*low, other], now=now)
    decisions = schedule(snap, NO_SRPT)
    assert {p.job_id for p in decisions.preemptions} == {10, 11}
    assert placed(decisions)[1].gpu_ids == (0,)
    # Only one of GPU 0's fractions may be stopped: stopping it frees no whole GPU, so nothing is stopped.
    mixed = [low[0], replace(low[1], priority=Priority.HIGH), other]
    assert not schedule(replace(snap, running=tuple(mixed)), NO_SRPT).preemptions


def test_every_policy_keeps_fractions_within_a_gpu():
    jobs = [frac(i, (0.25, 0.5, 0.75)[i % 3]) for i in range(1, 12)] + [pending(20, 2)]
    for policy in ("console", "fifo", "fifo-backfill", "fair-share"):
        decisions = schedule(snapshot(hosts(1, 4), jobs), PolicyConfig(policy=policy))
        assert max(load(decisions).values()) <= 100, policy
