"""One replica of an inference service: a built-in model behind HTTP, with dynamic batching.

    python -m workers.runtime.serve --workload mlp-digits --checkpoint outputs/model.pt --port 0
    CONSOLE_PRESET=infer-int8 python -m workers.runtime.serve --workload cnn-digits --max-batch 64

The agent starts it as a job process and the console's gateway forwards requests to it. The preset comes
from $CONSOLE_PRESET (an inference preset; default infer-fp32), the weights from --checkpoint, params
"checkpoint" or $CONSOLE_MODEL_PATH; with none of them it serves freshly initialised weights (warning).
Once listening it appends {"type": "serving", "port": ..., "ts": ...} to $CONSOLE_PROGRESS_FILE and prints
`serving on HOST:PORT`. SIGTERM/SIGINT: stop accepting, let in-flight requests finish (a few seconds at
most), append a "result" record with the serving statistics, exit 0.

Endpoints (JSON in, JSON out; errors are {"detail": "<reason>"}):
    GET  /health   {"ready", "workload", "preset", "quantized_layers", ...}
    POST /predict  {"inputs": [...]} -> digits: {"outputs": [class, ...], "probabilities": [[10 floats], ...]}
                   (each input: 64 numbers 0..16, an 8x8 image as in sklearn's digits, flat or 8 rows of 8)
                   tiny-lm: {"inputs": ["prompt", ...], "max_new_tokens": 16} -> {"outputs": ["greedy text", ...]}
    GET  /stats    {"requests", "errors", "batches", "batch_size_mean", "queue_depth",
                    "latency_ms": {"p50", "p95", "p99"}, "window_requests", "rps", "uptime_s", ...}
               (workers.protocol.ReplicaWindow: latencies and window_requests over 30 s, rps over 10 s)

Dynamic batching: concurrent requests are queued and collected for up to --max-wait-ms (from the oldest
queued request) or until --max-batch inputs, then run as one forward pass on a single inference thread
(the event loop keeps accepting meanwhile); while a batch runs, the next one fills up. --no-batching runs
each request's inputs as their own forward pass. More than --max-queue queued inputs: 503 at once.
Access: every request (every path, /health and /stats included) must carry the replica's secret in the
X-Replica-Secret header, else 401. The secret comes from $CONSOLE_REPLICA_SECRET (the agent sets it from the
console's dispatch), which the server removes from its environment once read; only the console's gateway and
reconciler hold it. It listens on --host only (default 127.0.0.1; the agent passes the host's registered
address), never on all interfaces. --no-auth (loopback --host only) serves without a secret, for local tries.
Exit codes: 0 stopped, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..protocol import (
    REPLICA_SECRET_ENV,
    REPLICA_SECRET_HEADER,
    JobEnvironment,
    ReplicaWindow,
    ServingProgress,
)
from . import checkpoint as ckpt
from . import session as session_mod
from .catalog import PRESETS
from .env import ENV_PRESET
from .inference import count_quantized
from .run_builtin import UsageError, resolve_params, seed_everything
from .workloads import get as get_workload
from .workloads.tiny_lm import TinyLM

log = logging.getLogger("workers.runtime")

DEFAULT_PRESET = "infer-fp32"
MAX_INPUTS_PER_REQUEST = 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_NEW_TOKENS = 128
DEFAULT_NEW_TOKENS = 16
MAX_PROMPT_CHARS = 4096
DIGIT_PIXELS = 64
DIGIT_MAX_VALUE = 16.0
GRACEFUL_SHUTDOWN_S = 5
MIN_SECRET_CHARS = 16
_SECRET_HEADER = REPLICA_SECRET_HEADER.lower().encode()

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class InputError(ValueError):
    """A request the server cannot use: answered 400 with this message."""


class Overloaded(RuntimeError):
    """Too many inputs queued: answered 503."""


# --- the model side ---------------------------------------------------------------------------------------

class Engine:
    """A prepared model plus the conversion between JSON inputs and tensors.

    `prepare` (event loop) validates one request's inputs into a payload; `run` (inference thread) runs the
    payloads of several requests as one forward pass and returns one JSON-ready answer per payload.
    """

    def __init__(self, *, workload: str, model: nn.Module, device: torch.device, input_dtype: torch.dtype,
                 preset: str, precision: str, quantized_layers: int, checkpoint: Path | None,
                 arch: dict[str, Any]) -> None:
        self.workload = workload
        self.model = model
        self.device = device
        self.input_dtype = input_dtype
        self.preset = preset
        self.precision = precision
        self.quantized_layers = quantized_layers
        self.checkpoint = checkpoint
        self.arch = arch
        self.codec = get_workload(workload)  # the workload's own encoding of inputs and outputs
        self.is_lm = isinstance(model, TinyLM) or workload == "tiny-lm"
        if self.is_lm:
            self.seq_len = int(arch["seq_len"])

    def describe(self) -> dict[str, Any]:
        return {"workload": self.workload, "preset": self.preset, "precision": self.precision,
                "quantized_layers": self.quantized_layers, "device": str(self.device),
                "checkpoint": str(self.checkpoint) if self.checkpoint else None, "arch": self.arch}

    # validation (event loop) -------------------------------------------------------------------------------

    def prepare(self, body: Any) -> Payload:
        if not isinstance(body, dict):
            raise InputError('the request body must be a JSON object like {"inputs": [...]}')
        if "inputs" not in body:
            raise InputError('"inputs" is missing: send {"inputs": [...]} with '
                             + ('prompt strings' if self.is_lm else 'one list of 64 numbers (0..16) per image'))
        inputs = body["inputs"]
        if not isinstance(inputs, list):
            raise InputError(f'"inputs" must be a list, not {_json_type(inputs)}')
        if not inputs:
            raise InputError('"inputs" is empty: send at least one input')
        if len(inputs) > MAX_INPUTS_PER_REQUEST:
            raise InputError(f'"inputs" holds {len(inputs)} items; at most {MAX_INPUTS_PER_REQUEST} per request')
        if self.is_lm:
            return self._prepare_prompts(inputs, body.get("max_new_tokens", DEFAULT_NEW_TOKENS))
        return Payload(len(inputs), _digits_array(inputs))

    def _prepare_prompts(self, inputs: list[Any], max_new_tokens: Any) -> Payload:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InputError(f'"max_new_tokens" must be a non-negative integer (at most {MAX_NEW_TOKENS}), '
                             f'got {json.dumps(max_new_tokens)}')
        new_tokens = min(max_new_tokens, MAX_NEW_TOKENS)
        prompts: list[list[int]] = []
        for index, prompt in enumerate(inputs):
            if not isinstance(prompt, str):
                raise InputError(f"inputs[{index}] must be a prompt string, not {_json_type(prompt)}")
            if not prompt:
                raise InputError(f"inputs[{index}] is an empty prompt: the model needs at least one character")
            if len(prompt) > MAX_PROMPT_CHARS:
                raise InputError(f"inputs[{index}] has {len(prompt)} characters; at most {MAX_PROMPT_CHARS}")
            # The model only ever sees its last seq_len characters; characters outside the training
            # corpus's vocabulary map to its first symbol (as in training).
            prompts.append(self.codec.model_inputs(prompt[-self.seq_len:]).tolist())
        return Payload(len(inputs), (prompts, new_tokens))

    # inference (worker thread) -----------------------------------------------------------------------------

    def run(self, payloads: list[Payload]) -> list[dict[str, Any]]:
        with torch.inference_mode():
            if self.is_lm:
                return self._run_lm(payloads)
            return self._run_digits(payloads)

    def _run_digits(self, payloads: list[Payload]) -> list[dict[str, Any]]:
        pixels = np.concatenate([p.data for p in payloads]) if len(payloads) > 1 else payloads[0].data
        # The same encoding as training (the workload's model_inputs), on this replica's device.
        x = self.codec.model_inputs(torch.from_numpy(pixels).to(self.device))
        logits = self.model(x.to(self.input_dtype))
        probabilities = torch.softmax(logits.float(), dim=-1).cpu().numpy().astype(np.float64)
        classes = probabilities.argmax(axis=-1).tolist()
        rounded = np.round(probabilities, 6).tolist()
        answers, start = [], 0
        for payload in payloads:
            end = start + payload.count
            answers.append({"outputs": classes[start:end], "probabilities": rounded[start:end]})
            start = end
        return answers

    def _run_lm(self, payloads: list[Payload]) -> list[dict[str, Any]]:
        # Greedy decoding, batched over prompts of equal length (the model has no padding mask, so only
        # those can share a forward pass); a group decodes its longest requested length, and shorter
        # requests take a prefix of it (greedy decoding makes that exact).
        flat: list[tuple[list[int], int]] = [(ids, p.data[1]) for p in payloads for ids in p.data[0]]
        texts: list[str] = [""] * len(flat)
        groups: dict[int, list[int]] = {}
        for index, (ids, _) in enumerate(flat):
            groups.setdefault(len(ids), []).append(index)
        for members in groups.values():
            steps = max(flat[i][1] for i in members)
            if steps == 0:
                continue
            ids = torch.tensor([flat[i][0] for i in members], dtype=torch.long, device=self.device)
            generated = []
            for _ in range(steps):
                logits = self.model(ids[:, -self.seq_len:])[:, -1]
                next_id = logits.float().argmax(dim=-1, keepdim=True)
                generated.append(next_id)
                ids = torch.cat([ids, next_id], dim=1)
            tokens = torch.cat(generated, dim=1).cpu()
            for row, i in enumerate(members):
                texts[i] = self.codec.decode_outputs(tokens[row, :flat[i][1]])[0]
        answers, start = [], 0
        for payload in payloads:
            answers.append({"outputs": texts[start:start + payload.count]})
            start += payload.count
        return answers

    def warm_up(self, max_batch: int) -> None:
        """A few forward passes before taking traffic (torchao kernels, torch.compile, allocator)."""
        started = time.perf_counter()
        if self.is_lm:
            sample = self.prepare({"inputs": ["The "], "max_new_tokens": 2})
            for size in sorted({1, max(1, max_batch)}):
                self.run([Payload(size, ([sample.data[0][0]] * size, 2))])
        else:
            for size in sorted({1, 2, max(1, max_batch)}):
                self.run([Payload(size, np.zeros((size, DIGIT_PIXELS), dtype=np.float32))])
        log.info("warm-up done in %.2f s", time.perf_counter() - started)


@dataclass
class Payload:
    count: int  # inputs in this request
    data: Any  # digits: float32 array (count, 64); tiny-lm: (list of token id lists, max_new_tokens)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


_NUMBER_TYPES = (int, float)


def _digits_array(inputs: list[Any]) -> np.ndarray:
    """(n, 64) float32 pixels from a list of images, each 64 numbers or 8 rows of 8, values 0..16."""
    out = np.empty((len(inputs), DIGIT_PIXELS), dtype=np.float32)
    for index, image in enumerate(inputs):
        if not isinstance(image, list):
            raise InputError(f"inputs[{index}] must be a list of {DIGIT_PIXELS} numbers (an 8x8 image, values "
                             f"0..16), not {_json_type(image)}")
        if len(image) == 8 and all(isinstance(row, list) for row in image):
            if any(len(row) != 8 for row in image):
                raise InputError(f"inputs[{index}] has 8 rows but not 8 numbers in each: send an 8x8 image "
                                 f"as 8 rows of 8 numbers or as {DIGIT_PIXELS} numbers")
            image = [value for row in image for value in row]
        if len(image) != DIGIT_PIXELS:
            raise InputError(f"inputs[{index}] has {len(image)} values; expected {DIGIT_PIXELS} "
                             f"(an 8x8 image, values 0..16)")
        if not all(type(value) in _NUMBER_TYPES for value in image):
            position = next(i for i, value in enumerate(image) if type(value) not in _NUMBER_TYPES)
            raise InputError(f"inputs[{index}][{position}] is {_json_type(image[position])}, not a number")
        try:
            row = np.asarray(image, dtype=np.float64)
        except OverflowError:  # an integer too large for a float
            raise InputError(f"inputs[{index}] holds a number out of range 0..16") from None
        low, high = float(row.min()), float(row.max())
        if not (low >= 0.0 and high <= DIGIT_MAX_VALUE):
            position = int(np.argmax((row < 0) | (row > DIGIT_MAX_VALUE) | ~np.isfinite(row)))
            raise InputError(f"inputs[{index}][{position}] = {image[position]} is out of range: pixel values "
                             f"are 0..16 (as in sklearn's digits)")
        out[index] = row
    return out


def build_engine(workload_name: str, params: dict[str, Any], preset: str, checkpoint: Path | None) -> Engine:
    """Load (or initialise) the workload's model and apply the inference preset to it."""
    workload = get_workload(workload_name)
    seed_everything(int(params.get("seed", 0)))
    rt = session_mod.start(preset=preset, install_signal_handler=False)
    try:
        arch = workload.arch(params)
        path = checkpoint or (Path(params["checkpoint"]) if params.get("checkpoint") else None) \
            or rt.env.model_path
        state = None
        if path is not None:
            if not path.exists():
                raise UsageError(f"checkpoint {path} does not exist")
            try:
                state, meta = ckpt.load_model_file(path)
            except Exception as exc:  # noqa: BLE001 - any unreadable file is a usage error here
                raise UsageError(f"cannot load checkpoint {path}: {exc}") from exc
            if meta.get("workload") and meta["workload"] != workload.name:
                raise UsageError(f"checkpoint {path} holds a {meta['workload']} model, not {workload.name}")
            if meta.get("arch"):
                arch = meta["arch"]  # serve the model that was trained, whatever the params say
            log.info("serving %s from %s (%s)", workload.name, path, arch)
        else:
            log.warning("no --checkpoint, params.checkpoint or CONSOLE_MODEL_PATH: serving freshly "
                        "initialised (untrained) %s weights", workload.name)
        model = workload.build_model(arch)
        if state is not None:
            try:
                model.load_state_dict(state)
            except RuntimeError as exc:
                raise UsageError(f"checkpoint {path} does not fit {workload.name} {arch}: {exc}") from exc
        model = rt.prepare_inference(model)
        input_dtype = rt.precision.dtype if rt.precision.name != "fp32" else torch.float32
        return Engine(workload=workload.name, model=model, device=rt.device, input_dtype=input_dtype,
                      preset=rt.preset.name, precision=rt.precision.name,
                      quantized_layers=count_quantized(model), checkpoint=path, arch=arch)
    finally:
        rt.close()


# --- batching ---------------------------------------------------------------------------------------------

@dataclass
class _Pending:
    payload: Payload
    future: asyncio.Future[dict[str, Any]]
    enqueued: float


class Batcher:
    """Collects concurrent requests into forward passes run on one inference thread."""

    def __init__(self, engine: Engine, *, max_batch: int, max_wait_s: float, batching: bool,
                 max_queue: int) -> None:
        self.engine = engine
        self.max_batch = max(1, max_batch)
        self.max_wait_s = max(0.0, max_wait_s)
        self.batching = batching
        self.max_queue = max_queue
        self.queued_items = 0
        self.batches = 0
        self.batched_items = 0
        self._pending: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(Overloaded("the server is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, payload: Payload) -> dict[str, Any]:
        if self._wakeup is None:
            raise Overloaded("the server is not started")
        if self.queued_items + payload.count > self.max_queue:
            raise Overloaded(f"overloaded: {self.queued_items} inputs already queued (at most {self.max_queue}); "
                             "retry later")
        loop = asyncio.get_running_loop()
        item = _Pending(payload, loop.create_future(), loop.time())
        self._pending.append(item)
        self.queued_items += payload.count
        self._wakeup.set()
        return await item.future

    def _take(self) -> list[_Pending]:
        batch = [self._pending.popleft()]
        items = batch[0].payload.count
        if self.batching:
            while self._pending and items + self._pending[0].payload.count <= self.max_batch:
                item = self._pending.popleft()
                batch.append(item)
                items += item.payload.count
        self.queued_items -= items
        return batch

    async def _loop(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            if self.batching:
                # Wait (from the oldest request's arrival) for a full batch; under load the queue has
                # filled up during the previous forward pass and this does not wait at all.
                deadline = self._pending[0].enqueued + self.max_wait_s
                while self.queued_items < self.max_batch and (remaining := deadline - loop.time()) > 0:
                    self._wakeup.clear()
                    try:
                        await asyncio.wait_for(self._wakeup.wait(), remaining)
                    except TimeoutError:
                        break
            batch = self._take()
            live = [item for item in batch if not item.future.done()]
            if not live:
                continue
            self.batches += 1
            self.batched_items += sum(item.payload.count for item in live)
            try:
                answers = await loop.run_in_executor(self._executor, self.engine.run,
                                                     [item.payload for item in live])
            except asyncio.CancelledError:
                for item in live:
                    if not item.future.done():
                        item.future.set_exception(Overloaded("the server is shutting down"))
                raise
            except Exception as exc:  # noqa: BLE001 - reported to each request of the batch
                log.exception("inference failed on a batch of %d requests", len(live))
                for item in live:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            for item, answer in zip(live, answers, strict=True):
                if not item.future.done():
                    item.future.set_result(answer)


# --- statistics -------------------------------------------------------------------------------------------

@dataclass
class Stats:
    started: float = field(default_factory=time.monotonic)
    requests: int = 0
    errors: int = 0
    rejected: int = 0
    inputs: int = 0
    in_flight: int = 0
    window: ReplicaWindow = field(init=False)

    def __post_init__(self) -> None:
        self.window = ReplicaWindow(self.started)

    def record(self, seconds: float, ok: bool, count: int = 0) -> None:
        self.requests += 1
        if ok:
            self.inputs += count
            self.window.add(time.monotonic(), seconds * 1000.0)
        else:
            self.errors += 1

    def snapshot(self, batcher: Batcher) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "rejected": self.rejected,
            "inputs": self.inputs,
            "batches": batcher.batches,
            "batch_size_mean": round(batcher.batched_items / batcher.batches, 3) if batcher.batches else 0.0,
            "queue_depth": batcher.queued_items,
            "in_flight": self.in_flight,
            **self.window.figures(time.monotonic()),
            "batching": batcher.batching,
            "max_batch": batcher.max_batch,
            "max_wait_ms": batcher.max_wait_s * 1000.0,
        }


# --- HTTP -------------------------------------------------------------------------------------------------

class _BodyTooLarge(Exception):
    pass


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


class ServeApp:
    """A minimal ASGI application: /health, /predict, /stats."""

    def __init__(self, engine: Engine, batcher: Batcher, secret: str | None) -> None:
        self.engine = engine
        self.batcher = batcher
        self.stats = Stats()
        self.ready = False
        self._secret = secret.encode() if secret is not None else None  # None: --no-auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.batcher.start()
                self.stats.started = time.monotonic()
                self.ready = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.ready = False
                await self.batcher.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _authorized(self, scope: Scope) -> bool:
        if self._secret is None:
            return True
        sent = [value for name, value in scope.get("headers", []) if name.lower() == _SECRET_HEADER]
        return len(sent) == 1 and hmac.compare_digest(sent[0], self._secret)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._authorized(scope):
            # Before routing: without the secret nothing is told, not even which paths exist.
            await _respond(send, 401, {"detail": f"send this replica's secret in {REPLICA_SECRET_HEADER}; "
                                                 "clients go through the console's gateway"})
            return
        path = scope["path"].rstrip("/") or "/"
        method = scope["method"]
        routes = {"/health": "GET", "/stats": "GET", "/predict": "POST"}
        if path not in routes:
            await _respond(send, 404, {"detail": f"no such endpoint {path}; try GET /health, POST /predict, "
                                                 "GET /stats"})
            return
        if method != routes[path] and not (method == "HEAD" and routes[path] == "GET"):
            await _respond(send, 405, {"detail": f"{path} takes {routes[path]}, not {method}"},
                           [(b"allow", routes[path].encode())])
            return
        if path == "/health":
            await _respond(send, 200 if self.ready else 503, {"ready": self.ready, **self.engine.describe()})
        elif path == "/stats":
            await _respond(send, 200, self.stats.snapshot(self.batcher))
        else:
            await self._predict(receive, send)

    async def _predict(self, receive: Receive, send: Send) -> None:
        self.stats.in_flight += 1
        try:
            await self._predict_one(receive, send)
        finally:
            self.stats.in_flight -= 1

    async def _predict_one(self, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status, answer, headers = 200, None, None
        count = 0
        try:
            body = await _read_body(receive)
            try:
                data = json.loads(body, parse_constant=_reject_constant)
            except (ValueError, UnicodeDecodeError) as exc:
                raise InputError(f"the request body is not valid JSON ({exc})") from None
            payload = self.engine.prepare(data)
            count = payload.count
            answer = await self.batcher.submit(payload)
        except InputError as exc:
            status, answer = 400, {"detail": str(exc)}
        except _BodyTooLarge:
            status, answer = 413, {"detail": f"the request body is larger than {MAX_BODY_BYTES} bytes"}
        except Overloaded as exc:
            self.stats.rejected += 1
            status, answer, headers = 503, {"detail": str(exc)}, [(b"retry-after", b"1")]
        except Exception as exc:  # noqa: BLE001 - an inference failure: answer it rather than drop it
            status, answer = 500, {"detail": f"inference failed: {type(exc).__name__}: {exc}"}
        await _respond(send, status, answer, headers)
        self.stats.record(time.perf_counter() - started, status == 200, count)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InputError("the client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _BodyTooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: Any,
                   headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


# --- the process ------------------------------------------------------------------------------------------

def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, announcing readiness once listening, and exiting 0 on SIGTERM (uvicorn re-raises
        the signal after a graceful shutdown, which would make the process die of it)."""

        on_ready: Callable[[], None] | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit and self.on_ready is not None:
                self.on_ready()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _bind(host: str, port: int) -> socket.socket:
    # A host name binds the first address it resolves to (the agent's --address may be either).
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(engine: Engine, *, host: str, port: int, max_batch: int, max_wait_ms: float, batching: bool,
          max_queue: int, progress_file: Path | None, secret: str | None,
          drain_s: int = GRACEFUL_SHUTDOWN_S) -> int:
    import uvicorn

    from .reporting import Reporter

    batcher = Batcher(engine, max_batch=max_batch, max_wait_s=max_wait_ms / 1000.0, batching=batching,
                      max_queue=max_queue)
    app = ServeApp(engine, batcher, secret)
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    reporter = Reporter(progress_file)
    # Keep-alive longer than its clients' pools keep idle connections (httpx: 5 s, the gateway's included), so that
    # the server never closes a connection a client is just reusing (uvicorn's own 5 s raced with them: ReadError).
    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning",
                            timeout_graceful_shutdown=drain_s, backlog=2048, timeout_keep_alive=75)
    server = _server_class()(config)

    def on_ready() -> None:
        reporter.emit(ServingProgress(port=bound_port, host=host, workload=engine.workload, preset=engine.preset,
                                      batching=batching).to_message())
        print(f"serving on {host}:{bound_port}", flush=True)
        log.info("%s (%s) ready on %s:%d; batching %s", engine.workload, engine.preset, host, bound_port,
                 f"up to {batcher.max_batch} inputs / {max_wait_ms:g} ms" if batching else "off")

    server.on_ready = on_ready
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    summary = app.stats.snapshot(batcher)
    reporter.emit({"type": "result", **{k: v for k, v in summary.items() if k != "latency_ms"},
                   **{f"latency_ms_{k}": v for k, v in summary["latency_ms"].items()}})
    log.info("stopped after %d requests (%d errors, %d batches)", summary["requests"], summary["errors"],
             summary["batches"])
    return 0


def _access_problem(host: str, secret: str, no_auth: bool) -> str | None:
    """Why this --host / secret / --no-auth combination may not serve, or None."""
    try:
        if ipaddress.ip_address(host).is_unspecified:
            return f"--host {host} listens on every interface; give the one address to serve on"
    except ValueError:
        pass  # a host name
    if no_auth:
        if secret:
            return f"--no-auth and ${REPLICA_SECRET_ENV} together: drop one"
        if host != "localhost" and not _is_loopback(host):
            return f"--no-auth serves anyone who reaches the port: only with a loopback --host, not {host}"
        return None
    if len(secret) < MIN_SECRET_CHARS:
        return (f"${REPLICA_SECRET_ENV} must hold the replica's secret (at least {MIN_SECRET_CHARS} characters); "
                "the agent sets it, or pass --no-auth with a loopback --host for a local try")
    return None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    log.warning("SIGTERM before serving: exiting")
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.runtime.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, choices=["mlp-digits", "cnn-digits", "tiny-lm"])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="model file to serve (default: params.checkpoint, then $CONSOLE_MODEL_PATH)")
    parser.add_argument("--params", default=None, help="JSON object of workload params (the model's shape "
                        "when serving fresh weights; a checkpoint's own shape wins)")
    parser.add_argument("--preset", default=None, help=f"overrides ${ENV_PRESET} (default {DEFAULT_PRESET})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the one address to listen on (default 127.0.0.1; never all interfaces)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--max-batch", type=int, default=32, help="most inputs in one forward pass")
    parser.add_argument("--max-wait-ms", type=float, default=5.0,
                        help="how long the oldest queued request waits for a batch to fill")
    parser.add_argument("--max-queue", type=int, default=4096, help="queued inputs beyond which requests get 503")
    parser.add_argument("--no-batching", action="store_true", help="run every request on its own")
    parser.add_argument("--drain-s", type=int, default=GRACEFUL_SHUTDOWN_S,
                        help="on SIGTERM, how long in-flight requests may take to finish before they are cut")
    parser.add_argument("--no-auth", action="store_true",
                        help=f"serve without ${REPLICA_SECRET_ENV} (local tries only: needs a loopback --host)")
    args = parser.parse_args(argv)
    try:
        job_env = JobEnvironment.from_env(os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    # Read once and dropped, so that nothing this process starts inherits it.
    secret = job_env.replica_secret
    os.environ.pop(REPLICA_SECRET_ENV, None)
    session_mod.configure_logging(force=True)
    if threading.current_thread() is threading.main_thread():
        # Stopped while still loading: nothing in flight, a clean exit (while serving, uvicorn's handler
        # takes over and drains first).
        signal.signal(signal.SIGTERM, _exit_on_sigterm)

    if args.max_batch < 1 or args.max_wait_ms < 0 or args.max_queue < 1 or not 0 <= args.port <= 65535 \
            or not math.isfinite(args.max_wait_ms) or not 0 < args.drain_s < 3600:
        parser.error("--max-batch and --max-queue must be at least 1, --max-wait-ms at least 0, "
                     "--port 0..65535, --drain-s above 0 and under an hour")
    problem = _access_problem(args.host, secret, args.no_auth)
    if problem:
        parser.error(problem)
    preset = args.preset or job_env.preset or DEFAULT_PRESET
    if preset not in PRESETS:
        parser.error(f"unknown preset {preset!r}; expected one of "
                     f"{', '.join(n for n, p in PRESETS.items() if p.kind == 'inference')}")
    if PRESETS[preset].kind != "inference":
        parser.error(f"preset {preset} is a training preset; serve with an inference preset "
                     f"({', '.join(n for n, p in PRESETS.items() if p.kind == 'inference')})")
    try:
        params = resolve_params(args.workload, args.params)
        engine = build_engine(args.workload, params, preset, args.checkpoint)
    except UsageError as exc:
        parser.error(str(exc))
    engine.warm_up(1 if args.no_batching else args.max_batch)
    try:
        return serve(engine, host=args.host, port=args.port, max_batch=args.max_batch,
                     max_wait_ms=args.max_wait_ms, batching=not args.no_batching, max_queue=args.max_queue,
                     progress_file=job_env.progress_file, secret=None if args.no_auth else secret,
                     drain_s=args.drain_s)
    except OSError as exc:
        log.error("cannot serve on %s:%d: %s", args.host, args.port, exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
