"""The API a job's script calls to run under the console.

    from workers.runtime import session

    rt = session.start()                                   # reads CONSOLE_* (and torchrun) env vars
    model, optimizer, loader = rt.prepare(model, optimizer, loader)   # applies CONSOLE_PRESET, resumes
    for x, y in rt.batches(loader, epochs=3):              # on the device; stops at CONSOLE_MAX_STEPS
        with rt.step_context():                            # autocast etc.
            loss = loss_fn(model(x), y)
        rt.backward(loss)
        if rt.optimizer_step():                            # False while accumulating gradients
            rt.report(loss=loss)
    rt.report_metrics(val_acc=evaluate(model))             # the job's own metrics, charted on its page
    rt.finish(accuracy=acc)                                # final weights + result record

On SIGTERM the next `optimizer_step()` saves a checkpoint to CONSOLE_CHECKPOINT_DIR and exits with 143;
`prepare()` resumes from the newest checkpoint there. Inference scripts use `prepare_inference()` and
`infer()` instead, which time every batch.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import resource
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from . import checkpoint as ckpt
from . import distributed as dist_utils
from . import presets as ops
from .catalog import PRESETS, Preset
from .env import RuntimeEnv
from .inference import LatencyStats, Timer, quantize_int8_dynamic
from .precision import Precision, resolve
from .presets import ResumableSampler
from .reporting import Reporter

log = logging.getLogger("workers.runtime")

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a process killed by SIGTERM
MODEL_FILE = "model.pt"
METRICS_FILE = "metrics.json"


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux (bytes on macOS; the console's hosts are Linux).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Session:
    def __init__(self, env: RuntimeEnv, preset: Preset, settings: dict[str, Any], *,
                 install_signal_handler: bool = True) -> None:
        self.env = env
        self.preset = preset
        self.settings = settings
        self.device = dist_utils.pick_device(env)
        self._owns_process_group = env.is_distributed and not torch.distributed.is_initialized()
        self.distributed = dist_utils.init_process_group(env, self.device)
        self.reporter = Reporter(env.progress_file, enabled=env.is_main)
        distributed_mode = settings.get("distributed")
        self.precision: Precision = resolve(settings.get("precision", "fp32"), self.device.type,
                                            autocast=bool(settings.get("autocast")))
        self.model: nn.Module | None = None  # what the script calls (maybe wrapped: DDP, compiled)
        self.module: nn.Module | None = None  # the user's module underneath
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: torch.amp.GradScaler | None = None
        self.teacher: nn.Module | None = None
        self.channels_last = False
        self.accumulation = 1
        self.step = 0
        self.epoch = 0
        self.samples_seen = 0  # by this process
        self.resumed_from: int | None = None
        self.model_meta: dict[str, Any] = {}
        self.max_steps = env.max_steps
        self._distributed_mode = distributed_mode if self.distributed else None
        self._batch_in_epoch = 0
        self._micro = 0
        self._planned_steps: int | None = None
        self._last_loss: float | None = None
        self._last_report: tuple[float, int, int] | None = None
        # Seconds spent waiting for the data loader's next batch (all of the run, and as of the last report).
        self._wait_s = 0.0
        self._wait_s_reported = 0.0
        self._train_start: tuple[float, int, int] | None = None
        self._warm_start: tuple[float, int, int] | None = None
        self._input_dtype: torch.dtype | None = None
        self._latency = LatencyStats()
        self._compiled_shapes: set[tuple[int, ...] | None] = set()
        self._rss_at_start = _rss_bytes()
        self._stop_requested = False
        self._previous_handler: Any = None
        self._handler_installed = False
        self._closed = False
        if distributed_mode and not self.distributed:
            log.warning("preset %s runs %s over several processes, but this job has one; running unwrapped "
                        "(launch with torchrun --nproc-per-node N)", preset.name, distributed_mode)
        elif self.distributed and not distributed_mode:
            log.warning("%d processes but preset %s is not distributed: each process trains its own copy",
                        env.world_size, preset.name)
        if install_signal_handler and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._handler_installed = True
        log.info("job %s: preset %s on %s (rank %d/%d), precision %s%s", env.job_id, preset.name, self.device,
                 env.rank, env.world_size, self.precision.name, " autocast" if self.precision.autocast else "")

    # --- properties -------------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def stop_requested(self) -> bool:
        """True once SIGTERM arrived (the next optimizer step saves a checkpoint and exits)."""
        return self._stop_requested

    @property
    def should_stop(self) -> bool:
        """True when CONSOLE_MAX_STEPS optimizer steps are done."""
        return self.max_steps is not None and self.step >= self.max_steps

    @property
    def planned_steps(self) -> int | None:
        return self.max_steps if self.max_steps is not None else self._planned_steps

    # --- training -------------------------------------------------------------------------------------

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                loader: DataLoader | None = None, *, teacher: nn.Module | None = None,
                global_batch: int | None = None, seed: int = 0,
                ) -> tuple[nn.Module, torch.optim.Optimizer | None, DataLoader | None]:
        """Apply the preset to a training setup and resume from the newest checkpoint, if any.

        Returns the model to call (possibly wrapped), the optimizer to step (possibly rebuilt) and the
        loader to iterate (rebuilt: sharded across processes, batch size and tuning per preset).
        `teacher` is used by the distill preset; `global_batch` is the memory-saver target (default: the
        loader's batch size times the number of processes); `seed` fixes the data order.
        """
        if self.preset.kind != "train":
            raise ValueError(f"preset {self.preset.name} is for inference: use prepare_inference()")
        settings = self.settings
        model.to(self.device)
        self.module = model

        distill = settings.get("distill")
        if distill:
            self._setup_teacher(model, teacher)
        elif teacher is not None:
            log.info("preset %s does not distill; ignoring the teacher", self.preset.name)

        prune_cfg = settings.get("prune")
        if prune_cfg:
            ops.apply_pruning(model, float(prune_cfg.get("sparsity", 0.5)),
                              prune_cfg.get("method", "l1_unstructured"))
        if settings.get("activation_checkpointing"):
            ops.apply_activation_checkpointing(model)
        self.channels_last = bool(settings.get("channels_last")) and ops.has_conv(model)
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
            log.info("conv net: using channels-last memory format")

        names_by_id = ops.named_parameter_ids(model)
        wrapped: nn.Module = model
        if self._distributed_mode == "ddp":
            wrapped = ops.wrap_ddp(model, self.device)
        elif self._distributed_mode == "fsdp2":
            param_dtype = self.precision.dtype if self.precision.name != "fp32" else None
            if param_dtype is not None and ops.has_batch_norm(model):
                # FSDP2 would cast batch-norm weights but not their fp32 running statistics, which the CPU
                # kernels reject: keep fp32 parameters and get the low precision from autocast instead.
                log.info("batch norm present: FSDP2 keeps fp32 parameters, compute runs under %s autocast",
                         self.precision.name)
                self.precision = dataclasses.replace(self.precision, autocast=True)
                param_dtype = None
            ops.shard_fsdp2(model, param_dtype)
        if settings.get("compile"):
            torch._dynamo.config.suppress_errors = True  # fall back to eager where compilation fails
            wrapped.compile()
            log.info("torch.compile enabled (the first steps compile)")
        self.model = wrapped

        if optimizer is not None:
            fused = bool(settings.get("fused_optimizer"))
            if self._distributed_mode == "fsdp2" or (fused and not ops.is_fused(optimizer)):
                optimizer = ops.rebuild_optimizer(optimizer, names_by_id, dict(model.named_parameters()),
                                                  fused=fused)
        self.optimizer = optimizer
        self.scaler = self.precision.make_scaler()
        if self.scaler is not None:
            log.info("loss scaling with GradScaler (%s)", self.precision.name)

        if loader is not None:
            loader = self._prepare_loader(loader, global_batch, seed)
        self._resume()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._rss_at_start = _rss_bytes()
        self._train_start = (time.perf_counter(), self.step, self.samples_seen)
        return self.model, self.optimizer, loader

    def _setup_teacher(self, student: nn.Module, teacher: nn.Module | None) -> None:
        if teacher is None:
            log.warning("preset %s needs a teacher model (prepare(..., teacher=...)); training without one",
                        self.preset.name)
            return
        teacher.to(self.device).eval().requires_grad_(False)
        self.teacher = teacher
        student_n, teacher_n = ops.parameter_count(student), ops.parameter_count(teacher)
        if student_n >= teacher_n:
            log.warning("the student (%d params) is not smaller than the teacher (%d params)", student_n,
                        teacher_n)
        log.info("distillation: student %d params, teacher %d params (%.0f%%)", student_n, teacher_n,
                 100 * student_n / max(teacher_n, 1))

    def _prepare_loader(self, loader: DataLoader, global_batch: int | None, seed: int) -> DataLoader:
        settings = self.settings
        batch_size = loader.batch_size or 1
        if settings.get("gradient_accumulation"):
            target = global_batch or batch_size * self.world_size
            micro = max(1, math.ceil(batch_size / int(settings.get("micro_batches", 4))))
            self.accumulation = ops.accumulation_steps(target, micro, self.world_size)
            log.info("gradient accumulation: %d micro-batches of %d per process -> global batch %d",
                     self.accumulation, micro, self.accumulation * micro * self.world_size)
            batch_size = micro
        tuning = dict(settings.get("loader", {}))
        if tuning.get("pin_memory") and self.device.type != "cuda":
            log.info("pinned memory only helps host-to-GPU copies; not pinning on %s", self.device.type)
            tuning["pin_memory"] = False
        drop_last = None
        if settings.get("compile") and len(loader.dataset) > batch_size * self.world_size:  # type: ignore[arg-type]
            # A smaller last batch would make torch.compile compile the model again, for dynamic shapes.
            drop_last = True
            log.info("torch.compile: dropping each epoch's incomplete last batch (static shapes)")
        rebuilt = ops.rebuild_loader(loader, batch_size=batch_size, world_size=self.world_size, rank=self.rank,
                                     seed=seed, num_workers=tuning.get("num_workers"),
                                     pin_memory=tuning.get("pin_memory"),
                                     prefetch_factor=tuning.get("prefetch_factor"), drop_last=drop_last)
        if tuning:
            log.info("data loader: %d workers, pin_memory=%s, prefetch_factor=%s", rebuilt.num_workers,
                     rebuilt.pin_memory, rebuilt.prefetch_factor)
        return rebuilt

    def to_device(self, batch: Any) -> Any:
        """`batch` moved to the job's device (and to channels-last / the inference dtype when the preset
        asks)."""
        return ops.move_to(batch, self.device, float_dtype=self._input_dtype, channels_last=self.channels_last,
                           non_blocking=self.device.type == "cuda")

    def batches(self, loader: DataLoader, epochs: int = 1) -> Iterator[Any]:
        """Iterate `epochs` passes over `loader`, batches on the device.

        Starts where a resumed checkpoint left off and stops after CONSOLE_MAX_STEPS optimizer steps.
        """
        self._planned_steps = epochs * math.ceil(len(loader) / self.accumulation)
        return self._iterate(loader, epochs)

    def _iterate(self, loader: DataLoader, epochs: int) -> Iterator[Any]:
        sampler = loader.sampler if isinstance(loader.sampler, DistributedSampler) else None
        while self.epoch < epochs and not self.should_stop:
            position = self._batch_in_epoch
            skip = 0
            if sampler is not None:
                sampler.set_epoch(self.epoch)
            if isinstance(sampler, ResumableSampler):
                sampler.start_index = position * (loader.batch_size or 1)
            else:
                skip, position = position, 0  # no resumable sampler: read and drop the consumed batches
            waiting_since = time.perf_counter()
            for batch in loader:
                position += 1
                if position <= skip:
                    continue
                self._batch_in_epoch = position
                self.samples_seen += ops.batch_size_of(batch)
                on_device = self.to_device(batch)
                self._wait_s += time.perf_counter() - waiting_since
                yield on_device
                if self.should_stop:
                    return
                waiting_since = time.perf_counter()
            if isinstance(sampler, ResumableSampler):
                sampler.start_index = 0
            self.epoch += 1
            self._batch_in_epoch = 0

    @contextlib.contextmanager
    def step_context(self) -> Iterator[None]:
        """Wrap the forward pass and loss computation of one micro-batch."""
        last_micro = (self._micro + 1) % self.accumulation == 0
        if self.accumulation > 1 and self.model is not None:
            # Skip the gradient all-reduce on micro-batches that only accumulate.
            if hasattr(self.model, "require_backward_grad_sync"):
                self.model.require_backward_grad_sync = last_micro
            elif hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(last_micro)
        with self.precision.autocast_context():
            yield

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The preset's autocast on its own (for evaluation code)."""
        return self.precision.autocast_context()

    def eval_forward(self, model: nn.Module, inputs: Any) -> Any:
        """A forward pass for evaluation code: bypasses DDP (no collectives) and torch.compile (no
        recompilation for eval mode); FSDP2 models run as they are, since every rank holds only a shard."""
        if self.module is not None and self._distributed_mode != "fsdp2":
            if self.settings.get("compile"):
                return self.module.forward(inputs)
            return self.module(inputs)
        return model(inputs)

    def distill_loss(self, loss: torch.Tensor, student_logits: torch.Tensor, inputs: Any) -> torch.Tensor:
        """Under the distill preset, mix `loss` with the KL divergence to the teacher's softened logits;
        otherwise return `loss` unchanged. Call inside step_context()."""
        if self.teacher is None:
            return loss
        cfg = self.settings.get("distill", {})
        temperature = float(cfg.get("temperature", 2.0))
        alpha = float(cfg.get("alpha", 0.5))
        with torch.no_grad():
            teacher_logits = self.teacher(inputs)
        vocab = student_logits.shape[-1]
        student = F.log_softmax(student_logits.float().reshape(-1, vocab) / temperature, dim=-1)
        target = F.softmax(teacher_logits.float().reshape(-1, vocab) / temperature, dim=-1)
        soft = F.kl_div(student, target, reduction="batchmean") * temperature**2
        return alpha * loss + (1.0 - alpha) * soft

    def backward(self, loss: torch.Tensor) -> None:
        if self.accumulation > 1:
            loss = loss / self.accumulation
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def optimizer_step(self) -> bool:
        """Step the optimizer once the micro-batches of one step are accumulated; True when it stepped.

        A step boundary is also where a pending SIGTERM is honoured: checkpoint, then exit 143.
        """
        if self.optimizer is None:
            raise RuntimeError("prepare() was called without an optimizer")
        self._micro += 1
        if self._micro % self.accumulation:
            return False
        max_norm = self.settings.get("max_grad_norm")
        if self.scaler is not None:
            if max_norm:
                self.scaler.unscale_(self.optimizer)
            self._clip(max_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self._clip(max_norm)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self._warm_start is None:
            # Rates in the result leave out the first step (compilation, allocator and cache warm-up).
            self._warm_start = (time.perf_counter(), self.step, self.samples_seen)
        stop = dist_utils.any_rank(self._stop_requested) if self.distributed \
            else self._stop_requested
        if stop:
            self._preempt()
        every = self.env.checkpoint_every
        if every and self.step % every == 0:
            self.save_checkpoint()
        return True

    def _clip(self, max_norm: float | None) -> None:
        if max_norm and self.model is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(max_norm))

    # --- reports ----------------------------------------------------------------------------------------

    def report(self, *, loss: float | torch.Tensor | None = None, step: int | None = None,
               samples: int | None = None, **extra: Any) -> None:
        """Report progress (rank 0 writes). `samples` is the total this process has processed so far
        (default: counted by batches()); `steps_per_s`/`samples_per_s` cover the time since the previous report,
        the `avg_` rates the run so far (as the result states them)."""
        if loss is not None:
            loss = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)
            self._last_loss = loss
        step = self.step if step is None else step
        samples = self.samples_seen if samples is None else samples
        now = time.perf_counter()
        previous = self._last_report or self._train_start or (now, step, samples)
        elapsed = max(now - previous[0], 1e-9)
        steps_per_s = (step - previous[1]) / elapsed
        samples_per_s = (samples - previous[2]) * self.world_size / elapsed
        self._last_report = (now, step, samples)
        # The interval's share spent waiting on data (the console's packing of shareable jobs reads it).
        extra.setdefault("wait_fraction", round(min(1.0, max(0.0, (self._wait_s - self._wait_s_reported) / elapsed)), 4))
        self._wait_s_reported = self._wait_s
        avg_steps_per_s, avg_samples_per_s = self._run_rates(now, step, samples)
        extra.setdefault("avg_steps_per_s", avg_steps_per_s)
        extra.setdefault("avg_samples_per_s", avg_samples_per_s)
        self.reporter.progress(step=step, max_steps=self.planned_steps, loss=loss, steps_per_s=steps_per_s,
                               samples_per_s=samples_per_s, epoch=self.epoch, **extra)

    def report_metrics(self, *, step: int | None = None, **metrics: float | torch.Tensor) -> None:
        """Report the job's own named metrics (rank 0 writes), e.g. `rt.report_metrics(val_acc=0.93)` after an
        evaluation; the job's page charts each name. `step` defaults to the current optimizer step."""
        self.reporter.metrics(step=self.step if step is None else step, metrics=dict(metrics))

    def _run_rates(self, now: float, step: int, samples: int) -> tuple[float, float]:
        """(steps/s, samples/s) of the run so far: from the end of its first step (compilation, allocator and
        cache warm-up left out) once a later step is done, else from the start of training."""
        start = self._warm_start if self._warm_start and step > self._warm_start[1] else self._train_start
        start = start or (now, step, samples)
        elapsed = max(now - start[0], 1e-9)
        return (step - start[1]) / elapsed, (samples - start[2]) * self.world_size / elapsed

    # --- checkpoints ------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path | None:
        """Save model, optimizer, step and RNG state to CONSOLE_CHECKPOINT_DIR (all ranks must call)."""
        if self.env.checkpoint_dir is None or self.model is None:
            log.warning("no CONSOLE_CHECKPOINT_DIR: not saving a checkpoint")
            return None
        extra = {"epoch": self.epoch, "batch_in_epoch": self._batch_in_epoch, "samples_seen": self.samples_seen,
                 "preset": self.preset.name, "job_id": self.env.job_id, "world_size": self.world_size,
                 "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                 "meta": self.model_meta}
        path = ckpt.save_checkpoint(self.env.checkpoint_dir, step=self.step, model=self.model,
                                    optimizer=self.optimizer, extra=extra)
        self.reporter.checkpoint(path=path, step=self.step)
        return path

    def _resume(self) -> None:
        if self.model is None:
            return
        found = ckpt.resume_latest(self.env.checkpoint_dir, self.model, self.optimizer)
        if found is None:
            return
        path, data = found
        if self.scaler is not None and data.get("scaler"):
            self.scaler.load_state_dict(data["scaler"])
        self.step = int(data["step"])
        self.epoch = int(data.get("epoch", 0))
        self._batch_in_epoch = int(data.get("batch_in_epoch", 0))
        self.samples_seen = int(data.get("samples_seen", 0))
        self._micro = self.step * self.accumulation
        ckpt.set_rng_state(data["rng"])
        self.resumed_from = self.step
        log.info("resumed from %s (step %d, epoch %d)", path, self.step, self.epoch)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stop_requested = True
        # Only a flag here: the checkpoint is taken at the next step boundary, where the state is consistent.
        log.warning("SIGTERM: will checkpoint and exit at the next step boundary")

    def _preempt(self) -> None:
        path = self.save_checkpoint()
        log.warning("preempted at step %d; checkpoint %s; exiting with %d", self.step, path,
                    PREEMPTED_EXIT_CODE)
        self.close()
        sys.exit(PREEMPTED_EXIT_CODE)

    # --- inference --------------------------------------------------------------------------------------

    def prepare_inference(self, model: nn.Module) -> nn.Module:
        """Apply an inference preset: eval mode, precision cast, int8 quantization, torch.compile."""
        if self.preset.kind != "inference":
            raise ValueError(f"preset {self.preset.name} is for training: use prepare()")
        settings = self.settings
        model.to(self.device).eval()
        self.module = model
        if self.precision.name != "fp32":
            model.to(self.precision.dtype)
            self._input_dtype = self.precision.dtype
            log.info("inference in %s", self.precision.name)
        if settings.get("quantize") == "int8_dynamic":
            quantize_int8_dynamic(model)
        elif settings.get("quantize"):
            raise ValueError(f"unknown quantization {settings['quantize']!r}")
        if settings.get("compile"):
            torch._dynamo.config.suppress_errors = True
            model.compile()
            log.info("torch.compile enabled (the first batches compile)")
        self.model = model
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._rss_at_start = _rss_bytes()
        return model

    def infer(self, model: nn.Module, loader: Any, *, warmup_batches: int = 1) -> Iterator[tuple[Any, Any]]:
        """Run `model` on every batch of `loader`, yielding (batch, output); each forward pass is timed.

        The first `warmup_batches` are left out of the latency statistics, and so is, under torch.compile,
        the first batch of each new input shape (it includes a compilation).
        """
        compiled = bool(self.settings.get("compile"))
        for index, batch in enumerate(loader):
            if self._stop_requested:
                # Nothing to save for inference: report the latencies measured so far and stop.
                log.warning("SIGTERM: stopping inference after %d batches; exiting with %d", index,
                            PREEMPTED_EXIT_CODE)
                self.reporter.result(**self._inference_summary(), preempted=True)
                self.close()
                sys.exit(PREEMPTED_EXIT_CODE)
            batch = self.to_device(batch)
            inputs = ops.inputs_of(batch)
            shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else None
            new_shape = compiled and shape not in self._compiled_shapes
            self._compiled_shapes.add(shape)
            with torch.inference_mode():
                timer = Timer(self.device)
                with timer:
                    output = model(inputs)
            if index < warmup_batches or new_shape:
                self._latency.warmup_batches += 1
            else:
                self._latency.add(timer.seconds, ops.batch_size_of(batch))
            yield batch, output

    def latency(self) -> dict[str, Any]:
        """Latency percentiles (ms) and throughput of the batches timed by infer() so far."""
        return self._latency.summary()

    def _inference_summary(self) -> dict[str, Any]:
        summary = self.latency()
        if self.module is not None:
            summary["params"] = ops.parameter_count(self.module)
        return summary

    # --- the end ----------------------------------------------------------------------------------------

    def memory(self) -> dict[str, Any]:
        if self.device.type == "cuda":
            return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                    "memory_kind": "cuda_max_allocated"}
        peak = _peak_rss_bytes()
        return {"peak_memory_bytes": peak, "memory_kind": "cpu_peak_rss",
                "memory_increase_bytes": max(0, peak - self._rss_at_start)}

    def finish(self, **metrics: Any) -> dict[str, Any]:
        """Save the final weights to CONSOLE_OUTPUT_DIR, report the result record, release resources.

        `metrics` (accuracy, final_loss...) are added to the result; every rank must call this."""
        result: dict[str, Any] = {"job_id": self.env.job_id, "kind": self.preset.kind, "preset": self.preset.name,
                                  "precision": self.precision.name, "device": str(self.device),
                                  "world_size": self.world_size}
        if self.preset.kind == "train" and self.model is not None:
            result.update(self._training_summary())
            model_path = self._save_final_model()
            if model_path is not None:
                result["model_path"] = str(model_path)
        elif self.preset.kind == "inference":
            result.update(self._inference_summary())
        result.update(self.memory())
        result.update(metrics)
        self.reporter.result(**result)
        if self.is_main and self.env.output_dir is not None:
            self.env.output_dir.mkdir(parents=True, exist_ok=True)
            (self.env.output_dir / METRICS_FILE).write_text(json.dumps(result, indent=2, default=str))
        self.close()
        return result

    def _training_summary(self) -> dict[str, Any]:
        now = time.perf_counter()
        steps_per_s, samples_per_s = self._run_rates(now, self.step, self.samples_seen)
        summary: dict[str, Any] = {
            "steps": self.step,
            "samples": self.samples_seen * self.world_size,
            "final_loss": self._last_loss,
            "steps_per_s": steps_per_s,
            "samples_per_s": samples_per_s,
            "train_time_s": now - self._train_start[0] if self._train_start else None,
            "accumulation_steps": self.accumulation,
            "resumed_from_step": self.resumed_from,
            "params": ops.parameter_count(self.module) if self.module is not None else None,
        }
        if self.settings.get("prune") and self.module is not None:
            summary["sparsity"] = ops.weight_sparsity(self.module)
        if self.teacher is not None:
            summary["teacher_params"] = ops.parameter_count(self.teacher)
        return summary

    def _save_final_model(self) -> Path | None:
        assert self.model is not None and self.module is not None
        if self.settings.get("prune"):
            ops.make_pruning_permanent(self.module)
        state, _ = ckpt.training_state(self.model, None)  # a collective under FSDP
        if self.env.output_dir is None or not self.is_main:
            return None
        meta = {**self.model_meta, "preset": self.preset.name, "step": self.step, "job_id": self.env.job_id}
        return ckpt.save_model_file(self.env.output_dir / MODEL_FILE, state, meta)

    def close(self) -> None:
        """Restore the SIGTERM handler and leave the process group (finish() calls this)."""
        if self._closed:
            return
        self._closed = True
        if self._handler_installed and threading.current_thread() is threading.main_thread():
            # None means the previous handler was not installed from Python: the default is the best match.
            signal.signal(signal.SIGTERM, self._previous_handler if self._previous_handler is not None
                          else signal.SIG_DFL)
        if self._owns_process_group:
            dist_utils.shutdown()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StdoutHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stdout is at the time (job logs are collected from stdout)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure_logging(force: bool = False) -> None:
    """Send the runtime's log lines to stdout: always with `force` (entry points), otherwise only when
    the script configured no logging itself."""
    if any(isinstance(h, _StdoutHandler) for h in log.handlers):
        return
    if force or not (logging.getLogger().handlers or log.handlers):
        log.addHandler(_StdoutHandler())
        log.setLevel(logging.INFO)


def start(env: Mapping[str, str] | None = None, *, preset: str | None = None,
          settings: Mapping[str, Any] | None = None, install_signal_handler: bool = True) -> Session:
    """A session for this job: `env` defaults to os.environ; `preset` overrides CONSOLE_PRESET and
    `settings` overrides parts of the preset's settings (e.g. {"prune": {"sparsity": 0.8}})."""
    configure_logging()
    runtime_env = RuntimeEnv.from_env(env)
    name = preset or runtime_env.preset
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
    cap_gpu_memory(runtime_env.gpu_memory_fraction)
    return Session(runtime_env, PRESETS[name], _merge(PRESETS[name].settings, settings or {}),
                   install_signal_handler=install_signal_handler)


def cap_gpu_memory(fraction: float | None) -> float | None:
    """A job sharing its GPU without MPS: cap PyTorch's allocator at its share (CONSOLE_GPU_MEMORY_FRACTION,
    checked to lie in (0, 1] by JobEnvironment).

    The agent also watches the job's memory through NVML and stops it past its share, so a neighbour never pays.
    """
    if fraction is None:
        return None
    import torch

    if not torch.cuda.is_available():
        log.info("GPU memory share %.2f: no CUDA device here, nothing to cap", fraction)
        return None
    for device in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(fraction, device)
    log.info("PyTorch's CUDA allocator capped at %.0f%% of the GPU's memory", 100 * fraction)
    return fraction
