"""The inference replica server end to end: real processes on port 0, real HTTP, a really trained model."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from .conftest import HEADERS, Replica, get, post

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def held_out_digits() -> tuple[list[list[float]], list[int]]:
    """The evaluation split the training never saw, as the raw 0..16 pixels a client sends."""
    from workers.runtime.workloads import get

    _, eval_set = get("mlp-digits").datasets({})
    images, labels = eval_set.tensors
    return (images * 16.0).round().tolist(), labels.tolist()


async def fire(url: str, bodies: list[dict], concurrency: int) -> list[httpx.Response]:
    """POST every body to url with `concurrency` requests in the air at once."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=HEADERS) as client:
        async def one(body: dict) -> httpx.Response:
            async with semaphore:
                return await client.post(url, json=body)

        return await asyncio.gather(*(one(body) for body in bodies))


def test_health_reports_workload_preset_and_quantized_layers(replicas: dict[str, Replica]) -> None:
    trained = replicas["trained"]
    response = get(f"{trained.url}/health", timeout=10)
    assert response.status_code == 200
    health = response.json()
    assert health["ready"] is True
    assert health["workload"] == "mlp-digits"
    assert health["preset"] == "infer-int8"
    assert health["quantized_layers"] == 3  # two hidden layers and the head, quantized by torchao
    assert health["arch"] == {"hidden": 256, "depth": 2}
    # The progress file told the agent where it listens.
    serving = [r for r in trained.records() if r["type"] == "serving"]
    assert serving[0]["port"] == trained.port and serving[0]["ts"] > 0
    assert f"serving on 127.0.0.1:{trained.port}" in trained.output()


def test_trained_int8_model_predicts_digits_with_concurrent_requests_batched(replicas: dict[str, Replica]) -> None:
    trained = replicas["trained"]
    images, labels = held_out_digits()
    before = trained.stats()
    # One image per request, 64 requests in the air: the server batches them.
    responses = asyncio.run(fire(f"{trained.url}/predict", [{"inputs": [image]} for image in images], 64))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200][:3]
    answers = [r.json() for r in responses]
    predicted = [answer["outputs"][0] for answer in answers]
    accuracy = sum(p == y for p, y in zip(predicted, labels, strict=True)) / len(labels)
    assert accuracy >= 0.85, accuracy
    probabilities = answers[0]["probabilities"][0]
    assert len(probabilities) == 10 and abs(sum(probabilities) - 1) < 1e-3
    assert max(range(10), key=probabilities.__getitem__) == predicted[0]

    after = trained.stats()
    assert after["requests"] - before["requests"] == len(images)
    batches = after["batches"] - before["batches"]
    inputs = after["inputs"] - before["inputs"]
    assert inputs == len(images)
    assert inputs / batches > 1, (inputs, batches)  # several requests shared each forward pass
    assert after["batch_size_mean"] > 1
    assert after["queue_depth"] == 0 and after["in_flight"] == 0
    assert after["latency_ms"]["p50"] is not None and after["latency_ms"]["p99"] >= after["latency_ms"]["p50"]
    assert after["rps"] > 0 and after["uptime_s"] > 0

    # Many inputs in one request give the same answers as one request each.
    images_8x8 = [[image[row * 8:(row + 1) * 8] for row in range(8)] for image in images[:50]]
    one = post(f"{trained.url}/predict", json={"inputs": images_8x8}, timeout=30)
    assert one.status_code == 200
    assert one.json()["outputs"] == predicted[:50]


def test_no_batching_runs_every_request_alone(replicas: dict[str, Replica]) -> None:
    unbatched = replicas["unbatched"]
    images, _ = held_out_digits()
    responses = asyncio.run(fire(f"{unbatched.url}/predict", [{"inputs": [image]} for image in images[:64]], 64))
    assert [r.status_code for r in responses] == [200] * 64
    assert all(len(r.json()["outputs"]) == 1 and 0 <= r.json()["outputs"][0] <= 9 for r in responses)
    stats = unbatched.stats()
    assert stats["batching"] is False
    assert stats["batches"] == stats["inputs"] == 64
    assert stats["batch_size_mean"] == 1.0
    assert get(f"{unbatched.url}/health", timeout=10).json()["workload"] == "cnn-digits"


@pytest.mark.parametrize(("body", "reason"), [
    (b"not json", "not valid JSON"),
    (b'{"inputs": [[1, 2, NaN]]}', "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"{}", '"inputs" is missing'),
    (b'{"inputs": "abc"}', '"inputs" must be a list'),
    (b'{"inputs": []}', '"inputs" is empty'),
    (b'{"inputs": [[1, 2, 3]]}', "inputs[0] has 3 values; expected 64"),
    (b'{"inputs": [' + b"[" + b",".join([b"0"] * 63) + b',"x"]' + b"]}", "inputs[0][63] is a string, not a number"),
    (b'{"inputs": [' + b"[" + b",".join([b"0"] * 63) + b",true]" + b"]}", "inputs[0][63] is a boolean"),
    (b'{"inputs": [' + b"[" + b",".join([b"0"] * 63) + b",99]" + b"]}", "inputs[0][63] = 99 is out of range"),
    (b'{"inputs": [' + b"[" + b",".join([b"0"] * 63) + b",1e400]" + b"]}", "out of range"),
    (b'{"inputs": [7]}', "inputs[0] must be a list of 64 numbers"),
    (b'{"inputs": [' + b",".join([b"[0]"] * 1025) + b"]}", "holds 1025 items; at most 1024"),
])
def test_bad_inputs_are_400_with_a_reason(replicas: dict[str, Replica], body: bytes, reason: str) -> None:
    trained = replicas["trained"]
    response = post(f"{trained.url}/predict", content=body, timeout=10,
                    headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert reason in response.json()["detail"]


def test_wrong_paths_and_methods(replicas: dict[str, Replica]) -> None:
    url = replicas["trained"].url
    assert get(f"{url}/nope", timeout=10).status_code == 404
    wrong = get(f"{url}/predict", timeout=10)
    assert wrong.status_code == 405 and "POST" in wrong.json()["detail"]


def test_tiny_lm_greedy_continuations_batched_and_validated(replicas: dict[str, Replica]) -> None:
    lm = replicas["lm"]
    url = f"{lm.url}/predict"
    one = post(url, json={"inputs": ["The keeper "], "max_new_tokens": 12}, timeout=30)
    assert one.status_code == 200, one.text
    text = one.json()["outputs"][0]
    assert isinstance(text, str) and len(text) == 12
    # Greedy: deterministic, the same alone or batched with others, and shorter lengths are prefixes.
    bodies = [{"inputs": ["The keeper ", "Once upon"], "max_new_tokens": n} for n in (12, 5, 12, 0)] * 4
    answers = [r.json() for r in asyncio.run(fire(url, bodies, 16))]
    for body, answer in zip(bodies, answers, strict=True):
        assert answer["outputs"][0] == text[:body["max_new_tokens"]]
        assert len(answer["outputs"][1]) == body["max_new_tokens"]
    default = post(url, json={"inputs": ["x"]}, timeout=30).json()["outputs"][0]
    assert len(default) == 16
    capped = post(url, json={"inputs": ["x"], "max_new_tokens": 10_000}, timeout=60).json()["outputs"][0]
    assert len(capped) == 128
    for body, reason in [({"inputs": [3]}, "must be a prompt string"), ({"inputs": [""]}, "empty prompt"),
                         ({"inputs": ["a"], "max_new_tokens": -1}, "max_new_tokens"),
                         ({"inputs": ["a"], "max_new_tokens": "5"}, "max_new_tokens")]:
        response = post(url, json=body, timeout=10)
        assert response.status_code == 400 and reason in response.json()["detail"], response.text


def test_sigterm_finishes_in_flight_requests_and_exits_0(replicas: dict[str, Replica]) -> None:
    lm = replicas["lm"]
    # Long generations, so some are still running when the signal arrives.
    body = {"inputs": ["The keeper "] + [f"prompt {i}" for i in range(15)], "max_new_tokens": 128}
    results: list[httpx.Response | Exception] = []

    def send() -> None:
        try:
            results.append(post(f"{lm.url}/predict", json=body, timeout=600))
        except Exception as exc:  # noqa: BLE001 - asserted below
            results.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.monotonic() + 30
    while lm.stats()["in_flight"] == 0:
        assert time.monotonic() < deadline, "the request never reached the server"
        time.sleep(0.005)
    assert lm.terminate(timeout=600) == 0, lm.output()
    thread.join(timeout=600)
    assert len(results) == 1 and isinstance(results[0], httpx.Response), results
    assert results[0].status_code == 200 and len(results[0].json()["outputs"]) == 16
    # Stopped listening, and left a result record for the agent.
    with pytest.raises(httpx.TransportError):
        get(f"{lm.url}/health", timeout=2)
    result = [r for r in lm.records() if r["type"] == "result"]
    assert result and result[-1]["requests"] >= 1
