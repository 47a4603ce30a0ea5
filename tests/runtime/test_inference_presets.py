"""Inference presets: precision, torchao int8 quantization, torch.compile, latency statistics."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch
from torch import nn

from workers.runtime import session
from workers.runtime.inference import LatencyStats, count_quantized
from workers.runtime.reporting import read_records

from .helpers import TinyMLP, tiny_loader


def run(rt: session.Session, model: nn.Module, batches: int = 6) -> list[torch.Tensor]:
    model = rt.prepare_inference(model)
    return [out for _, out in rt.infer(model, tiny_loader(batch_size=8, samples=8 * batches, shuffle=False))]


def test_infer_fp32_reports_latency_percentiles_and_throughput(job) -> None:
    rt = session.start(job.env("infer-fp32"))
    outputs = run(rt, TinyMLP())
    assert len(outputs) == 6 and all(o.dtype == torch.float32 for o in outputs)
    result = rt.finish(accuracy=0.5)
    assert result["batches"] == 5 and result["warmup_batches"] == 1
    assert 0 < result["latency_ms_p50"] <= result["latency_ms_p95"] <= result["latency_ms_p99"]
    assert result["throughput_samples_per_s"] > 0 and result["samples"] == 40
    (line,) = [r for r in read_records(job.progress) if r["type"] == "result"]
    assert line["latency_ms_p99"] == result["latency_ms_p99"] and line["accuracy"] == 0.5


def test_infer_bf16_casts_weights_and_inputs(job) -> None:
    rt = session.start(job.env("infer-bf16"))
    model = TinyMLP()
    outputs = run(rt, model)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(o.dtype == torch.bfloat16 for o in outputs)
    rt.finish()


def test_infer_fp16_falls_back_to_bf16_on_cpu(job, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="workers.runtime"):
        rt = session.start(job.env("infer-fp16"))
    assert any("falling back to bf16" in r.getMessage() for r in caplog.records)
    model = TinyMLP()
    outputs = run(rt, model, batches=2)
    assert all(o.dtype == torch.bfloat16 for o in outputs)
    assert rt.finish()["precision"] == "bf16"


def test_infer_int8_quantizes_linear_layers_with_torchao(job) -> None:
    rt = session.start(job.env("infer-int8"))
    model = TinyMLP()
    reference = TinyMLP()
    reference.load_state_dict(model.state_dict())
    outputs = run(rt, model, batches=2)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert count_quantized(model) == len(linears) == 3
    assert all(type(m.weight).__module__.startswith("torchao") for m in linears)
    x = tiny_loader(batch_size=8, samples=8, shuffle=False).dataset.tensors[0][:8]
    # Quantized, so not identical, but close to the fp32 model.
    torch.testing.assert_close(outputs[0], reference(x).detach(), atol=0.1, rtol=0.1)
    rt.finish()


def test_latency_stats_percentiles() -> None:
    stats = LatencyStats()
    for ms in range(1, 101):
        stats.add(ms / 1000, samples=2)
    summary = stats.summary()
    assert summary["latency_ms_p50"] == pytest.approx(50.5)
    assert summary["latency_ms_p99"] == pytest.approx(99.01)
    assert summary["throughput_samples_per_s"] == pytest.approx(200 / sum(range(1, 101)) * 1000)


def test_training_preset_refuses_inference_and_back(job) -> None:
    rt = session.start(job.env("baseline-fp32"), install_signal_handler=False)
    with pytest.raises(ValueError, match="for training"):
        rt.prepare_inference(TinyMLP())
    rt.close()
    rt = session.start(job.env("infer-fp32"), install_signal_handler=False)
    with pytest.raises(ValueError, match="for inference"):
        rt.prepare(TinyMLP())
    rt.close()


@pytest.mark.slow
def test_infer_compiled_uses_torch_compile(job) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    rt = session.start(job.env("infer-compiled"))
    model = TinyMLP(width=8, depth=1)
    model = rt.prepare_inference(model)
    assert model._compiled_call_impl is not None
    loader = tiny_loader(batch_size=8, samples=36, shuffle=False)  # 4 batches of 8, then one of 4
    outputs = [out for _, out in rt.infer(model, loader, warmup_batches=0)]
    assert len(outputs) == 5
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs_before
    result = rt.finish()
    # The first batch of each shape (a compilation) is not in the latency statistics.
    assert result["warmup_batches"] == 2 and result["batches"] == 3


def test_sigterm_stops_inference_with_143_and_a_partial_result(job) -> None:
    rt = session.start(job.env("infer-fp32"))
    model = rt.prepare_inference(TinyMLP())
    with pytest.raises(SystemExit) as exited:
        for index, _ in enumerate(rt.infer(model, tiny_loader(batch_size=8, samples=80, shuffle=False))):
            if index == 3:
                os.kill(os.getpid(), signal.SIGTERM)
    assert exited.value.code == 143
    result = read_records(job.progress)[-1]
    assert result["type"] == "result" and result["preempted"] is True and result["batches"] == 3
