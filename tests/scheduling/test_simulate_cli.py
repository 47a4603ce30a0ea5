import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from apps.scheduling.simulate import POLICY_NAMES, main, simulate
from apps.scheduling.trace import TraceJob

REPO = Path(__file__).resolve().parents[2]
TIRESIAS = REPO.parent / "shared" / "traces" / "tiresias" / "60_job.csv"


def job(job_id: int, gpus: int, submit: float, duration: float, team: str = "default") -> TraceJob:
    return TraceJob(job_id, gpus, submit, duration, "m", iterations=int(duration), step_s=1.0, team=team)


def test_oracles_on_a_tiny_trace():
    # One 2-GPU host. A (2 GPUs, 100 s) at 0; B (1 GPU, 10 s) at 1; C (1 GPU, 10 s) at 2.
    jobs = [job(0, 2, 0, 100), job(1, 1, 1, 10), job(2, 1, 2, 10)]
    fifo = simulate(jobs, "1x2", "fifo")
    assert fifo.avg_jct_h * 3600 == pytest.approx((100 + 109 + 108) / 3)
    srtf = simulate(jobs, "1x2", "srtf-oracle")
    # B and C preempt A at once (B at 1, C at 2 takes the second GPU), A resumes at 12 with 99 s left.
    assert srtf.avg_jct_h * 3600 == pytest.approx((10 + 10 + 111) / 3)
    assert srtf.preemptions == 1
    costly = simulate(jobs, "1x2", "srtf-oracle", preempt_cost_s=30)
    assert costly.avg_jct_h > srtf.avg_jct_h


def test_srsf_declared_orders_by_what_jobs_declare():
    # One GPU. A (100 s) at 0; B (10 s) at 1 declares 1,000 steps (100x its 10); C (50 s) at 2 declares nothing.
    truth = [job(0, 1, 0, 100), job(1, 1, 1, 10), job(2, 1, 2, 50)]
    overstated = [truth[0], replace(truth[1], declared_iterations=1000), replace(truth[2], declared_iterations=None)]
    # Told the truth (every job declaring its steps) it is the SRSF oracle: B preempts A at 1 and runs to 11, then
    # C (50 s) before A (99 s left): C 11-61, A 61-160. Told what they declare: C, which declares nothing and has
    # run nothing, preempts A at 2 (least attained first); B (1,000 s declared) waits behind A's 98 s left.
    exact = simulate(truth, "1x1", "srsf-declared")
    assert exact.avg_jct_h == simulate(truth, "1x1", "srsf-oracle").avg_jct_h
    assert exact.avg_jct_h * 3600 == pytest.approx((10 + 59 + 160) / 3)
    told = simulate(overstated, "1x1", "srsf-declared")
    # C at 2-52, A's 98 s at 52-150, B at 150-160
    assert told.avg_jct_h * 3600 == pytest.approx((150 + 159 + 50) / 3)


def test_a_pass_interval_passes_while_jobs_wait_as_the_consoles_beat_does():
    # One GPU: A runs 10,000 s from 0, B waits from 1 s. Without an interval the pass runs at arrivals and ends only;
    # with one of 1,000 s also about every 1,000 s in between (FIFO decides the same either way).
    jobs = [job(0, 1, 0, 10_000), job(1, 1, 1, 10)]
    events_only = simulate(jobs, "1x1", "fifo")
    beat = simulate(jobs, "1x1", "fifo", pass_interval_s=1000)
    assert beat.passes >= events_only.passes + 9
    assert beat.avg_jct_h == pytest.approx(events_only.avg_jct_h)


@pytest.mark.skipif(not TIRESIAS.exists(), reason="shared traces not present")
def test_the_command_line_passes_on_a_beat_by_default_and_not_with_zero(capsys):
    common = ["--trace", str(TIRESIAS), "--format", "tiresias", "--cluster", "2x4", "--policy", "fifo", "--json"]
    main(common)
    beat = json.loads(capsys.readouterr().out)[0]
    main([*common, "--pass-interval-s", "0"])
    events_only = json.loads(capsys.readouterr().out)[0]
    assert beat["passes"] > events_only["passes"]
    for refused in ("-5", "1e-13", "inf"):
        with pytest.raises(SystemExit):
            main([*common, "--pass-interval-s", refused])
        assert "--pass-interval-s" in capsys.readouterr().err


def test_a_beat_that_would_not_move_the_clock_is_refused():
    jobs = [job(0, 1, 0, 100), job(1, 1, 1, 10)]
    for refused in (-5.0, 1e-13, 0.0, float("inf")):
        with pytest.raises(ValueError, match="pass_interval_s"):
            simulate(jobs, "1x1", "fifo", pass_interval_s=refused)


def test_every_policy_runs_and_reports_teams(capsys):
    jobs = [job(i, 1 + i % 2, i * 5.0, 50.0 + 7 * i, team=f"t{i % 2}") for i in range(20)]
    for name in POLICY_NAMES:
        summary = simulate(jobs, "1x4", name, preempt_cost_s=5)
        assert summary.jobs == 20 and 0 < summary.gpu_utilization <= 1
        assert set(summary.teams) == {"t0", "t1"} and summary.worst_finish_time_fairness is not None


@pytest.mark.skipif(not TIRESIAS.exists(), reason="shared traces not present")
def test_cli_table_and_json(capsys):
    assert (
        main(["--trace", str(TIRESIAS), "--format", "tiresias", "--cluster", "16x4", "--policy", "all"]) == 0
    )
    table = capsys.readouterr().out
    assert all(name in table for name in POLICY_NAMES) and "avg JCT" in table
    main(
        [
            "--trace",
            str(TIRESIAS),
            "--format",
            "tiresias",
            "--cluster",
            "4x4",
            "--policy",
            "fifo,console",
            "--teams",
            "2",
            "--json",
        ]
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["fifo", "console"]
    assert rows[0]["worst_finish_time_fairness"] is not None


@pytest.mark.skipif(not TIRESIAS.exists(), reason="shared traces not present")
def test_module_entry_point():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "apps.scheduling.simulate",
            "--trace",
            str(TIRESIAS),
            "--format",
            "tiresias",
            "--cluster",
            "16x4",
            "--policy",
            "fifo",
            "--preempt-cost-s",
            "30",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)[0]["jobs"] == 60
