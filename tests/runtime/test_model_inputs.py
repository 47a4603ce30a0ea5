"""Each built-in workload encodes its inputs in one place (model_inputs), for training and serving alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.runtime.serve import Engine, Payload
from workers.runtime.workloads import get
from workers.runtime.workloads.digits import _digits
from workers.runtime.workloads.tiny_lm import corpus


@pytest.mark.parametrize("name, shape", [("mlp-digits", (64,)), ("cnn-digits", (1, 32, 32))])
def test_digits_training_inputs_are_the_encoding_of_the_raw_images(name: str, shape: tuple[int, ...]) -> None:
    workload = get(name)
    images, _ = _digits()
    encoded = workload.model_inputs(images[:5])
    assert encoded.shape == (5, *shape) and float(encoded.max()) <= 1.0
    # Flat rows of 64 pixels (as a client sends them) encode the same as 8x8 images.
    assert torch.equal(workload.model_inputs(images[:5].reshape(5, 64).tolist()), encoded)
    train_set, eval_set = workload.datasets({})
    every = torch.cat([torch.stack([x for x, _ in train_set]), torch.stack([x for x, _ in eval_set])])
    assert any(torch.equal(row, encoded[0]) for row in every)


@pytest.mark.parametrize("name", ["mlp-digits", "cnn-digits"])
def test_a_replica_feeds_its_model_the_training_encoding(name: str) -> None:
    workload = get(name)
    arch = {"hidden": 8, "depth": 1} if name == "mlp-digits" else {"channels": 4}
    model = workload.build_model(arch).eval()
    engine = Engine(workload=name, model=model, device=torch.device("cpu"), input_dtype=torch.float32,
                    preset="infer-fp32", precision="fp32", quantized_layers=0, checkpoint=None, arch=arch)
    images, _ = _digits()
    pixels = images[:3].reshape(3, 64).astype(np.float32)
    [answer] = engine.run([Payload(3, pixels)])
    with torch.no_grad():
        expected = workload.decode_outputs(model(workload.model_inputs(images[:3])))
    assert answer["outputs"] == expected


def test_tiny_lm_decodes_what_it_encodes() -> None:
    workload = get("tiny-lm")
    text, vocab = corpus()
    sample = text[:50]
    ids = workload.model_inputs(sample)
    assert ids.dtype == torch.long and workload.decode_outputs(ids) == [sample]
    assert workload.decode_outputs(torch.stack([ids, ids])) == [sample, sample]
    assert workload.decode_outputs(ids[:0]) == [""]
    assert workload.decode_outputs(workload.model_inputs("\u2603")) == [vocab[0]]  # outside the vocabulary
