"""What a built-in workload provides to the generic train/inference driver (run_builtin)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset


class BuiltinWorkload(ABC):
    name: str
    # The params that fix the model's shape: saved with the weights so inference rebuilds the same model.
    arch_keys: tuple[str, ...] = ()
    # The arch param scaled down for a distillation student.
    width_key: str = ""

    @abstractmethod
    def datasets(self, params: dict[str, Any]) -> tuple[Dataset[Any], Dataset[Any]]:
        """(train, eval) datasets of (inputs, targets) pairs; built without downloads."""

    @abstractmethod
    def build_model(self, arch: dict[str, Any]) -> nn.Module:
        ...

    # The model's inputs and outputs, encoded and decoded in one place: training (datasets, describe) and
    # serving (workers/runtime/serve.py) call these, so a model never sees inputs prepared another way.

    @abstractmethod
    def model_inputs(self, raw: Any) -> torch.Tensor:
        """Encode raw inputs (digits: a batch of 8x8 images, pixels 0..16; tiny-lm: text) as the model's input."""

    def decode_outputs(self, output: torch.Tensor) -> list[Any]:
        """Decode a batch of the model's outputs: one answer per input (default: the highest-scoring class)."""
        answers: list[Any] = output.argmax(dim=-1).tolist()
        return answers

    def arch(self, params: dict[str, Any]) -> dict[str, Any]:
        return {key: params[key] for key in self.arch_keys}

    def student_arch(self, arch: dict[str, Any], width: float) -> dict[str, Any]:
        return {**arch, self.width_key: max(1, round(arch[self.width_key] * width))}

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output.float().reshape(-1, output.shape[-1]), target.reshape(-1))

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
        """(correct predictions, predictions) in a batch."""
        predicted = output.argmax(dim=-1)
        return int((predicted == target).sum()), target.numel()

    def describe(self, model: nn.Module, output: dict[str, Any]) -> None:
        """Add workload-specific extras (e.g. a text sample) to the final metrics."""
        output.setdefault("workload", self.name)
