"""Run a built-in workload under the job's preset.

    python -m workers.runtime.run_builtin --workload mlp-digits --kind train --params '{"epochs": 3}'
    torchrun --nproc-per-node 2 -m workers.runtime.run_builtin --workload tiny-lm --kind train

The preset, step limit, progress file and directories come from the CONSOLE_* environment variables.
Exit codes: 0 done, 2 bad arguments, 143 preempted (checkpoint saved).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from . import checkpoint as ckpt
from . import session as session_mod
from .catalog import WORKLOADS, validate_params
from .session import Session
from .workloads import BuiltinWorkload, get

log = logging.getLogger("workers.runtime")

TEACHER_FILE = "teacher.pt"
REPORT_EVERY_S = 5.0


class UsageError(ValueError):
    pass


def resolve_params(workload_name: str, raw: str | None) -> dict[str, Any]:
    """The workload's defaults overlaid with the JSON `raw` params, validated against the catalogue."""
    if workload_name not in WORKLOADS:
        raise UsageError(f"unknown workload {workload_name!r}; expected one of {', '.join(WORKLOADS)}")
    spec = WORKLOADS[workload_name]
    try:
        given = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        raise UsageError(f"--params is not valid JSON: {exc}") from exc
    if not isinstance(given, dict):
        raise UsageError("--params must be a JSON object")
    errors = validate_params(spec, given)
    if errors:
        raise UsageError("; ".join(f"{name}: {message}" for name, message in errors.items()))
    return {**{name: p.default for name, p in spec.params.items()}, **given}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_path(rt: Session, params: dict[str, Any]) -> Path | None:
    if params.get("checkpoint"):
        return Path(params["checkpoint"])
    return rt.env.model_path


def load_weights(model: nn.Module, path: Path) -> None:
    state, _ = ckpt.load_model_file(path)
    model.load_state_dict(state)
    log.info("loaded weights from %s", path)


@torch.no_grad()
def evaluate(rt: Session, workload: BuiltinWorkload, model: nn.Module, dataset: Dataset[Any],
             batch_size: int) -> dict[str, float]:
    """Accuracy and mean loss over `dataset` (every rank evaluates all of it: FSDP needs every rank)."""
    loader = DataLoader(dataset, batch_size=batch_size)
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for batch in loader:
        inputs, targets = rt.to_device(batch)
        with rt.autocast():
            output = rt.eval_forward(model, inputs)
        loss_sum += float(workload.loss(output, targets)) * targets.numel()
        hits, count = workload.correct(output, targets)
        correct += hits
        total += count
    model.train(was_training)
    return {"accuracy": correct / max(total, 1), "eval_loss": loss_sum / max(total, 1)}


def train_teacher(rt: Session, workload: BuiltinWorkload, arch: dict[str, Any], params: dict[str, Any],
                  dataset: Dataset[Any]) -> nn.Module:
    """The distill preset's teacher: loaded from params.checkpoint, from an earlier attempt of this job, or
    trained here first (plain fp32, same epochs and step limit as the student)."""
    teacher = workload.build_model(arch)
    given = model_path(rt, params)
    saved = rt.env.checkpoint_dir / TEACHER_FILE if rt.env.checkpoint_dir else None
    if given is not None:
        load_weights(teacher, given)
        return teacher
    if saved is not None and saved.exists():
        load_weights(teacher, saved)
        return teacher
    log.info("training the teacher first (%d params)", sum(p.numel() for p in teacher.parameters()))
    teacher.to(rt.device).train()
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=params["lr"])
    loader = DataLoader(dataset, batch_size=params["batch_size"], shuffle=True,
                        generator=torch.Generator().manual_seed(params["seed"]))
    steps = 0
    for _ in range(params["epochs"]):
        for batch in loader:
            inputs, targets = rt.to_device(batch)
            loss = workload.loss(teacher(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            if rt.max_steps is not None and steps >= rt.max_steps:
                break
        else:
            continue
        break
    log.info("teacher trained for %d steps (last loss %.4f)", steps, float(loss.detach()))
    if saved is not None and rt.is_main:
        ckpt.save_model_file(saved, teacher.state_dict(), {"workload": workload.name, "arch": arch})
    return teacher


def train(rt: Session, workload: BuiltinWorkload, params: dict[str, Any]) -> dict[str, Any]:
    seed_everything(params["seed"])
    train_set, eval_set = workload.datasets(params)
    arch = workload.arch(params)
    teacher = None
    distill = rt.settings.get("distill")
    if distill:
        teacher = train_teacher(rt, workload, arch, params, train_set)
        arch = workload.student_arch(arch, float(distill.get("student_width", 0.5)))
    model = workload.build_model(arch)
    if not distill and (path := model_path(rt, params)) is not None:
        load_weights(model, path)
    rt.model_meta = {"workload": workload.name, "arch": arch}
    optimizer = torch.optim.AdamW(model.parameters(), lr=params["lr"])
    loader = DataLoader(train_set, batch_size=params["batch_size"], shuffle=True)
    model, optimizer, loader = rt.prepare(model, optimizer, loader, teacher=teacher, seed=params["seed"])
    assert optimizer is not None and loader is not None

    batches = rt.batches(loader, epochs=params["epochs"])
    log_every = max(1, (rt.planned_steps or 0) // 20)
    last_loss: torch.Tensor | None = None
    reported_step, reported_at = -1, time.monotonic()
    for inputs, targets in batches:
        with rt.step_context():
            output = model(inputs)
            loss = rt.distill_loss(workload.loss(output, targets), output, inputs)
        rt.backward(loss)
        last_loss = loss.detach()
        # A report every twentieth of the run, and at least every few seconds of a long one (the console's
        # steps and rates stay live).
        if rt.optimizer_step() and (rt.step % log_every == 0 or rt.step == 1
                                    or time.monotonic() - reported_at >= REPORT_EVERY_S):
            rt.report(loss=last_loss)
            reported_step, reported_at = rt.step, time.monotonic()
    if last_loss is not None and reported_step != rt.step:
        rt.report(loss=last_loss)
    metrics = evaluate(rt, workload, model, eval_set, params["batch_size"])
    workload.describe(rt.module or model, metrics)
    return rt.finish(**metrics)


def infer(rt: Session, workload: BuiltinWorkload, params: dict[str, Any]) -> dict[str, Any]:
    seed_everything(params["seed"])
    arch = workload.arch(params)
    path = model_path(rt, params)
    state = None
    if path is not None:
        state, meta = ckpt.load_model_file(path)
        if meta.get("arch") and meta.get("workload") == workload.name:
            arch = meta["arch"]  # serve the model that was trained, whatever the params say
        log.info("serving %s (%s)", path, arch)
    else:
        log.warning("no params.checkpoint or CONSOLE_MODEL_PATH: running on untrained weights")
    params = {**params, **arch}
    _, eval_set = workload.datasets(params)
    model = workload.build_model(arch)
    if state is not None:
        model.load_state_dict(state)
    model = rt.prepare_inference(model)
    loader = DataLoader(eval_set, batch_size=params["batch_size"])
    batches = 0
    correct = total = 0
    for repeat in range(params["infer_passes"]):
        for batch, output in rt.infer(model, loader, warmup_batches=1 if repeat == 0 else 0):
            if repeat == 0:
                hits, count = workload.correct(output, batch[1])
                correct += hits
                total += count
            batches += 1
            if rt.max_steps is not None and batches >= rt.max_steps:
                break
        else:
            continue
        break
    return rt.finish(accuracy=correct / max(total, 1), checkpoint=str(path) if path else None,
                     arch=arch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.runtime.run_builtin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--kind", required=True, choices=["train", "inference"])
    parser.add_argument("--params", default=None, help="JSON object of workload params")
    parser.add_argument("--preset", default=None, help="overrides $CONSOLE_PRESET")
    args = parser.parse_args(argv)
    session_mod.configure_logging(force=True)
    try:
        params = resolve_params(args.workload, args.params)
    except UsageError as exc:
        parser.error(str(exc))
    rt = session_mod.start(preset=args.preset)
    try:
        if rt.preset.kind != args.kind:
            rt.close()
            parser.error(f"preset {rt.preset.name} is a {rt.preset.kind} preset, not {args.kind}")
        workload = get(args.workload)
        if args.kind == "train":
            train(rt, workload, params)
        else:
            infer(rt, workload, params)
    finally:
        rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
