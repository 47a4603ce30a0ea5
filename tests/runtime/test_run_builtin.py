"""`python -m workers.runtime.run_builtin` end to end for every built-in workload, at tiny sizes."""

from __future__ import annotations

import json

import pytest

from workers.runtime import checkpoint as ckpt
from workers.runtime import run_builtin
from workers.runtime.catalog import WORKLOADS
from workers.runtime.reporting import read_records
from workers.runtime.workloads import BUILTINS

from .helpers import run_python

TINY = {
    "mlp-digits": {"hidden": 32, "batch_size": 32},
    "cnn-digits": {"channels": 4, "batch_size": 32},
    "tiny-lm": {"d_model": 32, "layers": 1, "heads": 2, "seq_len": 16, "batch_size": 16},
}


def run_main(monkeypatch, env: dict[str, str], *args: str) -> int:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return run_builtin.main(list(args))


def test_catalogue_and_builtins_agree() -> None:
    assert set(BUILTINS) == set(WORKLOADS)
    for name, workload in BUILTINS.items():
        params = run_builtin.resolve_params(name, json.dumps(TINY[name]))
        assert set(workload.arch_keys) <= set(params)


@pytest.mark.parametrize("workload", sorted(TINY))
def test_train_then_serve(workload, job, monkeypatch, capsys) -> None:
    params = json.dumps(TINY[workload])
    env = job.env("baseline-fp32", CONSOLE_MAX_STEPS="4")
    assert run_main(monkeypatch, env, "--workload", workload, "--kind", "train", "--params", params) == 0
    out = capsys.readouterr().out
    assert "step 4/4" in out and "samples/s" in out
    result = read_records(job.progress)[-1]
    assert result["type"] == "result" and result["steps"] == 4
    assert 0.0 <= result["accuracy"] <= 1.0 and result["final_loss"] > 0
    if workload == "tiny-lm":
        assert result["sample"].startswith("The keeper ")
    state, meta = ckpt.load_model_file(job.output / "model.pt")
    assert meta["workload"] == workload and meta["arch"] == {k: TINY[workload].get(k, meta["arch"][k])
                                                             for k in meta["arch"]}

    # Serve the trained weights: the architecture comes from the model file, whatever the params say.
    env = job.env("infer-int8", CONSOLE_MODEL_PATH=str(job.output / "model.pt"))
    assert run_main(monkeypatch, env, "--workload", workload, "--kind", "inference",
                    "--params", json.dumps({"infer_passes": 1, "batch_size": 64})) == 0
    served = read_records(job.progress)[-1]
    assert served["type"] == "result" and served["kind"] == "inference"
    assert served["accuracy"] == pytest.approx(result["accuracy"], abs=0.1)
    assert served["latency_ms_p50"] > 0 and served["arch"] == meta["arch"]


def test_distill_trains_a_teacher_then_a_smaller_student(job, monkeypatch) -> None:
    env = job.env("distill", CONSOLE_MAX_STEPS="3")
    assert run_main(monkeypatch, env, "--workload", "mlp-digits", "--kind", "train",
                    "--params", json.dumps(TINY["mlp-digits"])) == 0
    result = read_records(job.progress)[-1]
    assert result["params"] < result["teacher_params"]
    _, meta = ckpt.load_model_file(job.output / "model.pt")
    assert meta["arch"]["hidden"] == 16  # student_width 0.5
    assert (job.checkpoints / run_builtin.TEACHER_FILE).exists()  # reused if the job is resumed


def test_cli_rejects_bad_params_and_kind(job) -> None:
    bad = run_python(["-m", "workers.runtime.run_builtin", "--workload", "mlp-digits", "--kind", "train",
                      "--params", '{"hidden": "wide", "colour": 1}'], job.env())
    assert bad.returncode == 2
    assert "hidden: must be an integer" in bad.stderr and "colour: unknown parameter" in bad.stderr
    wrong_kind = run_python(["-m", "workers.runtime.run_builtin", "--workload", "mlp-digits", "--kind", "train"],
                            job.env("infer-fp32"))
    assert wrong_kind.returncode == 2 and "inference preset" in wrong_kind.stderr
