"""Each training preset really applies its settings (on the CPU)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workers.runtime import checkpoint as ckpt
from workers.runtime import presets as ops
from workers.runtime import session
from workers.runtime.catalog import PRESETS
from workers.runtime.precision import resolve

from .helpers import TinyConvNet, TinyMLP, tiny_loader


def train(rt: session.Session, model: nn.Module, optimizer: torch.optim.Optimizer, loader, epochs: int = 1,
          observe=None, teacher: nn.Module | None = None) -> list[float]:
    model, optimizer, loader = rt.prepare(model, optimizer, loader, teacher=teacher)
    losses = []
    for x, y in rt.batches(loader, epochs=epochs):
        with rt.step_context():
            if observe is not None:
                observe()
            out = model(x)
            loss = rt.distill_loss(F.cross_entropy(out.float(), y), out, x)
        rt.backward(loss)
        if rt.optimizer_step():
            rt.report(loss=loss)
            losses.append(float(loss.detach()))
    return losses


def autocast_probe(seen: list) -> callable:
    return lambda: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))


def test_every_catalogue_preset_starts(job) -> None:
    for name, preset in PRESETS.items():
        rt = session.start(job.env(name), install_signal_handler=False)
        assert rt.preset is preset
        rt.close()


def test_baseline_runs_fp32_without_autocast(job) -> None:
    seen: list = []
    rt = session.start(job.env("baseline-fp32"))
    model = TinyMLP()
    train(rt, model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), observe=autocast_probe(seen))
    assert seen and all(not enabled for enabled, _ in seen)
    assert rt.scaler is None and rt.precision.name == "fp32"
    rt.finish()


def test_amp_bf16_autocasts_inside_the_step(job) -> None:
    seen: list = []
    outputs: list[torch.dtype] = []
    rt = session.start(job.env("amp-bf16"))
    model = TinyMLP()
    model.head.register_forward_hook(lambda m, i, o: outputs.append(o.dtype))
    train(rt, model, torch.optim.AdamW(model.parameters()), tiny_loader(), observe=autocast_probe(seen))
    assert seen and all(enabled and dtype == torch.bfloat16 for enabled, dtype in seen)
    assert set(outputs) == {torch.bfloat16}
    assert not torch.is_autocast_enabled("cpu")  # only inside the step
    assert rt.scaler is None
    rt.finish()


def test_amp_fp16_falls_back_to_bf16_on_cpu_with_a_warning(job, caplog) -> None:
    seen: list = []
    with caplog.at_level(logging.WARNING, logger="workers.runtime"):
        rt = session.start(job.env("amp-fp16"))
    assert any("fp16 needs a GPU" in r.getMessage() for r in caplog.records)
    assert rt.precision.requested == "fp16" and rt.precision.name == "bf16" and rt.precision.fell_back
    model = TinyMLP()
    train(rt, model, torch.optim.AdamW(model.parameters()), tiny_loader(), observe=autocast_probe(seen))
    assert seen and all(dtype == torch.bfloat16 for _, dtype in seen)
    assert rt.scaler is None  # bf16 needs no loss scaling
    rt.finish()


def test_fp16_on_a_gpu_uses_a_grad_scaler() -> None:
    precision = resolve("fp16", "cuda")
    assert precision.name == "fp16" and precision.autocast and precision.grad_scaler
    assert resolve("bf16", "cpu").grad_scaler is False
    assert resolve("fp32", "cpu").autocast is False


def test_grad_scaler_path_scales_the_loss(job) -> None:
    """The GradScaler branch of backward/optimizer_step, exercised with the CPU scaler."""
    rt = session.start(job.env("amp-fp16"), settings={"autocast": False})
    model = TinyMLP()
    reference = copy.deepcopy(model)
    _, optimizer, loader = rt.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader())
    rt.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = next(iter(rt.batches(loader)))
    F.cross_entropy(reference(x), y).backward()
    with rt.step_context():
        loss = F.cross_entropy(model(x), y)
    rt.backward(loss)
    torch.testing.assert_close(model.head.bias.grad, 1024.0 * reference.head.bias.grad)
    assert rt.optimizer_step()
    # The scaler unscaled before stepping: the update is the plain SGD update.
    with torch.no_grad():
        expected = reference.head.bias - 0.1 * reference.head.bias.grad
    torch.testing.assert_close(model.head.bias, expected)
    rt.finish()


def test_memory_saver_checkpoints_blocks_and_accumulates(job, monkeypatch) -> None:
    calls = {"checkpoint": 0, "block_forward": 0}
    real_checkpoint = torch.utils.checkpoint.checkpoint

    def counting_checkpoint(*args, **kwargs):
        calls["checkpoint"] += 1
        return real_checkpoint(*args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counting_checkpoint)
    rt = session.start(job.env("memory-saver"))
    model = TinyMLP(depth=2)
    model.blocks[0][0].register_forward_hook(lambda *a: calls.__setitem__("block_forward",
                                                                             calls["block_forward"] + 1))
    seen: list = []
    _, _, loader = rt.prepare(model, torch.optim.AdamW(model.parameters()), tiny_loader(batch_size=16, samples=64))
    assert all(getattr(block, ops.CHECKPOINTED_ATTR, False) for block in model.blocks)
    assert loader.batch_size == 4 and rt.accumulation == 4  # 16 = 4 micro-batches of 4
    micro = steps = 0
    for x, y in rt.batches(loader):
        with rt.step_context():
            seen.append(torch.get_autocast_dtype("cpu"))
            loss = F.cross_entropy(model(x).float(), y)
        rt.backward(loss)
        micro += 1
        steps += rt.optimizer_step()
    assert micro == 16 and steps == 4 and rt.step == 4
    assert calls["checkpoint"] == 2 * micro  # two blocks per micro-batch
    assert calls["block_forward"] == 2 * micro  # forward + recomputation during backward
    assert set(seen) == {torch.bfloat16}
    result = rt.finish()
    assert result["accumulation_steps"] == 4
    # No wrapper modules: the saved weights load into a plain model.
    state, _ = ckpt.load_model_file(job.output / "model.pt")
    TinyMLP(depth=2).load_state_dict(state)


def test_memory_saver_reaches_a_target_global_batch(job) -> None:
    rt = session.start(job.env("memory-saver"))
    model = TinyMLP()
    _, _, loader = rt.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                              tiny_loader(batch_size=16, samples=128), global_batch=64)
    assert loader.batch_size == 4 and rt.accumulation == 16
    rt.close()


def test_prune_finetune_reaches_target_sparsity(job) -> None:
    rt = session.start(job.env("prune-finetune"), settings={"prune": {"sparsity": 0.7}})
    model = TinyMLP(width=32)
    losses = train(rt, model, torch.optim.AdamW(model.parameters(), lr=1e-2), tiny_loader(), epochs=3)
    assert len(losses) == 12
    assert ops.weight_sparsity(model) >= 0.69  # masks keep pruned weights at zero through fine-tuning
    result = rt.finish()
    assert result["sparsity"] >= 0.69
    state, _ = ckpt.load_model_file(job.output / "model.pt")
    assert not any(key.endswith(("_orig", "_mask")) for key in state)  # pruning made permanent
    plain = TinyMLP(width=32)
    plain.load_state_dict(state)
    assert ops.weight_sparsity(plain) >= 0.69


def test_distill_trains_a_smaller_student_on_teacher_logits(job) -> None:
    teacher = TinyMLP(width=64)
    student = TinyMLP(width=8)
    teacher_calls = []
    teacher.register_forward_hook(lambda m, i, o: teacher_calls.append(o.shape))
    rt = session.start(job.env("distill"))
    model, optimizer, loader = rt.prepare(student, torch.optim.AdamW(student.parameters()), tiny_loader(),
                                          teacher=teacher)
    assert ops.parameter_count(student) < ops.parameter_count(teacher)
    x, y = next(iter(rt.batches(loader)))
    with rt.step_context():
        out = model(x)
        hard = F.cross_entropy(out, y)
        mixed = rt.distill_loss(hard, out, x)
    assert teacher_calls and not torch.allclose(hard, mixed)
    # The soft term is the KL divergence to the teacher: zero when the student matches the teacher.
    with torch.no_grad():
        same = rt.distill_loss(hard, teacher(x), x)
    torch.testing.assert_close(same, 0.5 * hard)
    rt.backward(mixed)
    assert rt.optimizer_step()
    assert all(p.grad is None for p in teacher.parameters())
    result = rt.finish()
    assert result["params"] < result["teacher_params"]


def test_distill_without_a_teacher_warns_and_trains(job, caplog) -> None:
    rt = session.start(job.env("distill"))
    model = TinyMLP()
    with caplog.at_level(logging.WARNING, logger="workers.runtime"):
        train(rt, model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader())
    assert any("needs a teacher" in r.getMessage() for r in caplog.records)
    rt.finish()


def test_throughput_settings_without_compile(job) -> None:
    """channels-last, fused optimizer and the tuned loader (compilation has its own, slower test)."""
    rt = session.start(job.env("throughput"), settings={"compile": False})
    model = TinyConvNet()
    optimizer = torch.optim.AdamW(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(32, 1, 8, 8), torch.randint(0, 4, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = rt.prepare(model, optimizer, loader)
    assert ops.is_fused(optimizer)
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert loader.num_workers == 2 and loader.prefetch_factor == 2 and loader.persistent_workers
    assert loader.pin_memory is False  # nothing to pin for on a CPU-only host
    for x, y in rt.batches(loader):
        assert x.is_contiguous(memory_format=torch.channels_last)
        with rt.step_context():
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16
            loss = F.cross_entropy(model(x).float(), y)
        rt.backward(loss)
        rt.optimizer_step()
    assert rt.step == 4
    rt.finish()


def test_unfused_optimizer_falls_back_with_a_warning(caplog) -> None:
    class NoFused(torch.optim.SGD):
        def __init__(self, params, lr=0.1, fused=None, **kwargs):
            if fused:
                raise RuntimeError("fused not supported on this device")
            super().__init__(params, lr=lr, **kwargs)

    model = TinyMLP()
    old = NoFused(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="workers.runtime"):
        new = ops.rebuild_optimizer(old, ops.named_parameter_ids(model), dict(model.named_parameters()), fused=True)
    assert isinstance(new, NoFused) and not ops.is_fused(new)
    assert any("fused" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_throughput_compiles_the_model(job) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    rt = session.start(job.env("throughput"), settings={"loader": {"num_workers": 0}})
    model = TinyMLP(width=8, depth=1)
    model, optimizer, loader = rt.prepare(model, torch.optim.AdamW(model.parameters()), tiny_loader(batch_size=16))
    assert model._compiled_call_impl is not None
    assert loader.drop_last  # static shapes: no recompilation for a smaller last batch
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for x, y in rt.batches(loader):
        with rt.step_context():
            loss = F.cross_entropy(model(x).float(), y)
        rt.backward(loss)
        rt.optimizer_step()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames_before
    assert ops.is_fused(optimizer)
    rt.finish()
