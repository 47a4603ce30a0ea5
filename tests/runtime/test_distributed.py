"""ddp and fsdp presets in two real processes under torchrun, over gloo on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from workers.runtime import checkpoint as ckpt
from workers.runtime.reporting import read_records

from .helpers import TinyMLP, torchrun

pytestmark = pytest.mark.slow


def probe(job, preset: str, model: str = "mlp", name: str = "probe", **env: str) -> list[dict]:
    out = job.root / name
    out.mkdir()
    done = torchrun(["tests/runtime/dist_probe.py", str(out), model], job.env(preset, **env))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_ddp_wraps_the_model_and_shards_the_data(job) -> None:
    ranks = probe(job, "ddp")
    assert [r["model_type"] for r in ranks] == ["DistributedDataParallel"] * 2
    assert [r["sampler"] for r in ranks] == [[2, 0], [2, 1]]
    assert not set(ranks[0]["indices"]) & set(ranks[1]["indices"])  # each rank its own half of the data
    assert len(ranks[0]["indices"]) + len(ranks[1]["indices"]) == 64
    assert all(set(r["autocast"]) == {"torch.bfloat16"} for r in ranks)
    # Different data on each rank, identical weights after training: gradients were all-reduced.
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert ranks[0]["steps"] == 8
    records = read_records(job.progress)
    assert len([r for r in records if r["type"] == "progress"]) == 8  # rank 0 only
    (result,) = [r for r in records if r["type"] == "result"]
    assert result["world_size"] == 2 and result["samples"] == 64 * 2


def test_fsdp2_shards_parameters_as_dtensors(job) -> None:
    ranks = probe(job, "fsdp", CONSOLE_CHECKPOINT_EVERY="8")
    for r in ranks:
        assert r["dtensor"] and r["placements"] == ["(Shard(dim=0),)"]
        assert r["local_numel"] < r["full_numel"]
    assert ranks[0]["local_numel"] + ranks[1]["local_numel"] == ranks[0]["full_numel"]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert all(set(r["autocast"]) == {None} for r in ranks)  # bf16 comes from FSDP's mixed precision
    # Checkpoint and final weights are full (unsharded), so any host and any world size can load them.
    data = ckpt.load_file(ckpt.latest_checkpoint(job.checkpoints))
    assert data["step"] == 8 and data["world_size"] == 2
    model = TinyMLP(width=16)
    model.load_state_dict(data["model"])
    state, _ = ckpt.load_model_file(job.output / "model.pt")
    model.load_state_dict(state)
    assert float(sum(p.detach().double().sum() for p in model.parameters())) == pytest.approx(ranks[0]["checksum"])
    assert all(v.dtype == torch.float32 for v in state.values())


def test_fsdp2_with_batch_norm_falls_back_to_autocast(job) -> None:
    ranks = probe(job, "fsdp", model="batchnorm")
    for r in ranks:
        assert r["dtensor"] and r["precision"] == ["bf16", True]
        assert set(r["autocast"]) == {"torch.bfloat16"}
    assert ranks[0]["checksum"] == ranks[1]["checksum"]


@pytest.mark.parametrize("preset", ["ddp", "fsdp"])
def test_resume_when_only_rank_zero_sees_the_checkpoint(job, preset) -> None:
    """As after a preemption of a multi-host job: rank 0 reads the checkpoint and broadcasts it."""
    elsewhere = str(job.root / "other-host-checkpoints")
    probe(job, preset, name="first", CONSOLE_MAX_STEPS="5", CONSOLE_CHECKPOINT_EVERY="4",
          PROBE_OTHER_RANKS_CHECKPOINT_DIR=elsewhere)
    assert not (job.root / "other-host-checkpoints").exists()
    resumed = probe(job, preset, name="second", PROBE_OTHER_RANKS_CHECKPOINT_DIR=elsewhere)
    assert [r["resumed_from"] for r in resumed] == [4, 4]
    assert [r["steps"] for r in resumed] == [8, 8]
    assert resumed[0]["checksum"] == resumed[1]["checksum"]
    if preset == "fsdp":
        reference = probe(job, preset, name="reference", CONSOLE_CHECKPOINT_DIR=str(job.root / "reference"))
        assert resumed[0]["checksum"] == reference[0]["checksum"]  # as if never interrupted
