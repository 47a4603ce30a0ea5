"""Packing of gang jobs under `console-share`: groups of equal-GPU-count jobs interleaved on one GPU set, slowed by
the interference model, formed only under the slowdown bound, never over PACK_LIMIT jobs on a GPU."""

import pytest

import apps.scheduling.simulate as simulate_module
from apps.scheduling.config import PolicyConfig
from apps.scheduling.interference import slowdowns
from apps.scheduling.packing import PackingConfig, plan_packing
from apps.scheduling.policy import schedule
from apps.scheduling.simulate import make_decider, simulate, team_quotas
from apps.scheduling.simulation import PACK_LIMIT, Simulator
from apps.scheduling.trace import TraceJob, build_hosts
from apps.scheduling.types import PendingJob, Priority, RunningJob

BALANCED = (1.0, (0.5, 0.5, 0.0))
CPU_LEAN = (1.0, (0.7, 0.2, 0.0))  # with BALANCED: round max(1.2, 0.7, 1.0) = 1.2 -> 1.2x each
CPU_HEAVY = (1.0, (0.9, 0.05, 0.0))  # two of them: round 1.8 -> 1.8x each, over the bound
LIGHT = (1.0, (0.2, 0.2, 0.2))  # four of them: round max(0.8, 1.0) = 1.0 -> no slowdown


def job(job_id, gpus, submit, duration, model, prof, priority=Priority.NORMAL):
    return TraceJob(
        job_id,
        gpus,
        submit,
        duration,
        model,
        iterations=int(duration),
        step_s=prof[0],
        resource_s=prof[1],
        priority=priority,
    )


def run(jobs, hosts=1, per_host=4, policy="console-share", watch=None):
    sim = Simulator(jobs, build_hosts(hosts, per_host), schedule, team_quotas(jobs, hosts * per_host), 0.0)
    sim.decide = make_decider(policy, sim, PolicyConfig())
    if watch is not None:
        join = sim.join

        def watched(job_id, gpu_ids):
            join(job_id, gpu_ids)
            watch(sim)

        sim.join = watched
    result = sim.run(policy)
    return sim, {s.trace.job_id: s for s in result.jobs}


def test_two_complementary_gangs_share_four_gpus_at_the_models_slowdown(monkeypatch):
    # Job 0 (model "b") runs first, so the console has measured the "b" workload when job 2 arrives (measurement
    # at once here, instead of after MEASURE_S).
    monkeypatch.setattr(simulate_module, "MEASURE_S", 0.0)
    jobs = [
        job(0, 4, 0.0, 10.0, "b", CPU_LEAN),
        job(1, 4, 20.0, 1000.0, "a", BALANCED),
        job(2, 4, 30.0, 1000.0, "b", CPU_LEAN),
    ]
    factor = slowdowns([BALANCED, CPU_LEAN])
    assert factor == pytest.approx([1.2, 1.2])
    _, states = run(jobs)
    a, b = states[1], states[2]
    assert b.first_start == pytest.approx(30.0)  # joined job 1 on its 4 GPUs instead of waiting
    # Job 1: 10 s alone, then its remaining 990 s at 1 / 1.2 speed.
    assert a.finish == pytest.approx(30.0 + 990.0 * 1.2)
    # Job 2: 990 s of work done by then (1188 s at 1 / 1.2), the last 10 s alone.
    assert b.finish == pytest.approx(a.finish + 10.0)
    # The 4 GPUs were busy once, not once per member: 10 + 10 s for job 0, 1208 s of joint run, split evenly.
    assert a.attained_gpu_s + b.attained_gpu_s == pytest.approx(4 * (b.finish - 20.0))


def test_a_job_whose_workload_was_never_measured_is_not_packed():
    # Job 0 of model "b" ran 10 s, less than MEASURE_S: nothing is known of "b" when job 2 arrives. (On 2 GPUs:
    # a run of the same program and GPU count would be a similar run of job 2, ordering it before job 1.)
    assert simulate_module.MEASURE_S > 10.0
    jobs = [
        job(0, 2, 0.0, 10.0, "b", CPU_LEAN),
        job(1, 4, 20.0, 1000.0, "a", BALANCED),
        job(2, 4, 30.0, 1000.0, "b", CPU_LEAN),
    ]
    _, states = run(jobs)
    assert states[2].first_start == pytest.approx(states[1].finish) == pytest.approx(1020.0)


def test_a_group_over_the_slowdown_bound_is_not_formed(monkeypatch):
    monkeypatch.setattr(simulate_module, "MEASURE_S", 0.0)
    jobs = [
        job(0, 2, 0.0, 10.0, "c", CPU_HEAVY),  # (on 2 GPUs: not a similar run of jobs 1 and 2, as above)
        job(1, 4, 20.0, 1000.0, "c", CPU_HEAVY),
        job(2, 4, 30.0, 1000.0, "c", CPU_HEAVY),
    ]
    assert min(slowdowns([CPU_HEAVY, CPU_HEAVY])) > PackingConfig().max_slowdown
    _, states = run(jobs)
    first, second = sorted((states[1], states[2]), key=lambda s: s.first_start)
    assert second.first_start == pytest.approx(first.finish)  # waited for the GPUs: no group
    assert first.finish - first.first_start == pytest.approx(1000.0)


def test_no_gpu_holds_more_than_the_pack_limit_and_no_job_runs_faster_than_alone(monkeypatch):
    monkeypatch.setattr(simulate_module, "MEASURE_S", 0.0)
    jobs = [job(0, 2, 0.0, 5.0, "l", LIGHT)] + [
        job(i, 2 if i % 2 else 1, 10.0 + i, 200.0 + 7 * i, "l", LIGHT) for i in range(1, 25)
    ]
    seen = []

    def watch(sim):
        per_gpu: dict[int, int] = {}
        for running in sim.running.values():
            for gpu_id in running.gpu_ids:
                per_gpu[gpu_id] = per_gpu.get(gpu_id, 0) + 1
        seen.append(max(per_gpu.values()))
        assert max(per_gpu.values()) <= PACK_LIMIT

    _, states = run(jobs, per_host=4, watch=watch)
    assert max(seen) == PACK_LIMIT  # the limit was reached, never passed
    for state in states.values():
        assert state.finish is not None
        assert state.finish - state.first_start >= state.trace.duration_s - 1e-6


def test_packing_shortens_the_average_jct_over_plain_console(monkeypatch):
    monkeypatch.setattr(simulate_module, "MEASURE_S", 0.0)
    jobs = [job(0, 4, 0.0, 10.0, "b", CPU_LEAN), job(1, 4, 20.0, 1000.0, "a", BALANCED)] + [
        job(2, 4, 30.0, 1000.0, "b", CPU_LEAN)
    ]
    plain = simulate(jobs, "1x4", "console")
    packed = simulate(jobs, "1x4", "console-share")
    assert packed.avg_jct_h < plain.avg_jct_h
    assert packed.gpu_utilization <= 1.0


def running(job_id, gpu_ids):
    return RunningJob(job_id, "t", "u", len(gpu_ids), Priority.NORMAL, tuple(gpu_ids), 0.0, 0.0)


def pending(job_id, gpus):
    return PendingJob(job_id, "t", "u", gpus, Priority.NORMAL, 0.0)


def test_plan_packing_matches_gpu_counts_prefers_the_best_gain_and_skips_unknown_profiles():
    profiles = {1: CPU_HEAVY, 2: BALANCED, 3: CPU_HEAVY, 10: (1.0, (0.05, 0.9, 0.0)), 11: BALANCED}
    runs = [running(1, (0, 1)), running(2, (2, 3)), running(3, (4, 5, 6, 7))]
    waiting = [pending(10, 2), pending(11, 8), pending(12, 2)]  # 11: no 8-GPU group; 12: never measured
    joins = plan_packing(waiting, runs, profiles.get, PackingConfig())
    # GPU-heavy job 10 complements CPU-heavy job 1 (1.0x each) better than BALANCED job 2.
    assert joins == [(10, (0, 1))]


def test_plan_packing_fills_a_group_up_to_its_limit():
    profiles = {1: LIGHT, **{j: LIGHT for j in range(10, 16)}}
    joins = plan_packing([pending(j, 1) for j in range(10, 16)], [running(1, (0,))], profiles.get, PackingConfig())
    assert [j for j, _ in joins] == [10, 11, 12]  # 1 running + 3 joined = 4


def test_a_group_whose_first_member_is_preempted_is_preempted_whole(monkeypatch):
    monkeypatch.setattr(simulate_module, "MEASURE_S", 0.0)
    jobs = [
        job(3, 4, 0.0, 10.0, "b", CPU_LEAN),
        job(0, 4, 20.0, 5000.0, "a", BALANCED, Priority.LOW),
        job(1, 4, 30.0, 5000.0, "b", CPU_LEAN, Priority.LOW),
        job(2, 4, 2000.0, 100.0, "a", BALANCED, Priority.HIGH),
    ]
    _, states = run(jobs)
    assert states[1].first_start == pytest.approx(30.0)  # packed with job 0
    assert states[2].first_start == pytest.approx(2000.0)  # the urgent one takes the 4 GPUs at once
    assert states[2].finish == pytest.approx(2100.0)  # alone: nobody was left on its GPUs
    assert states[0].preemptions == states[1].preemptions == 1
    for state in states.values():
        assert state.finish - state.first_start >= state.trace.duration_s - 1e-6
