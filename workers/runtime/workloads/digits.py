"""mlp-digits and cnn-digits: scikit-learn's shipped 8x8 handwritten digits (no download)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from .base import BuiltinWorkload

EVAL_FRACTION = 0.2
PIXEL_MAX = 16.0  # sklearn's digits: pixel values 0..16
IMAGE_SIDE = 8


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    """The raw images (n, 8, 8), pixels 0..16, and their labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.images.astype(np.float32), data.target.astype(np.int64)


def _pixels(raw: Any) -> torch.Tensor:
    """(n, 64) float32 pixels scaled to 0..1 from n images given as 64 values or 8 rows of 8, 0..16."""
    images = torch.as_tensor(raw, dtype=torch.float32)
    return images.reshape(-1, IMAGE_SIDE * IMAGE_SIDE) / PIXEL_MAX


def _split(images: torch.Tensor, labels: torch.Tensor) -> tuple[Dataset[Any], Dataset[Any]]:
    # A fixed permutation, so every run (and every process) sees the same split.
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    cut = int(len(labels) * (1 - EVAL_FRACTION))
    train, held_out = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[held_out], labels[held_out])


class MLP(nn.Module):
    def __init__(self, hidden: int, depth: int, inputs: int = 64, classes: int = 10) -> None:
        super().__init__()
        widths = [inputs] + [hidden] * depth
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths[:-1], widths[1:], strict=True))
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CNN(nn.Module):
    # GroupNorm rather than BatchNorm: no running statistics that lag behind in short runs, and the same
    # behaviour whatever the per-process batch size (DDP, FSDP, gradient accumulation).
    def __init__(self, channels: int, image_size: int = 32, classes: int = 10) -> None:
        super().__init__()
        widths = [1, channels, channels * 2, channels * 4]
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(a, b, 3, padding=1, bias=False), nn.GroupNorm(math.gcd(b, 8), b), nn.ReLU(),
                          nn.MaxPool2d(2))
            for a, b in zip(widths[:-1], widths[1:], strict=True))
        # A linear head over the whole final feature map: digits need to know *where* strokes are, which
        # global average pooling would throw away (and it learns several times slower here).
        side = image_size // 2 ** len(self.blocks)
        self.head = nn.Linear(widths[-1] * side * side, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x.flatten(1))


class MLPDigits(BuiltinWorkload):
    name = "mlp-digits"
    arch_keys = ("hidden", "depth")
    width_key = "hidden"

    def datasets(self, params: dict[str, Any]) -> tuple[Dataset[Any], Dataset[Any]]:
        images, labels = _digits()
        return _split(self.model_inputs(torch.from_numpy(images)), torch.from_numpy(labels))

    def model_inputs(self, raw: Any) -> torch.Tensor:
        return _pixels(raw)

    def build_model(self, arch: dict[str, Any]) -> nn.Module:
        return MLP(hidden=int(arch["hidden"]), depth=int(arch.get("depth", 2)))


class CNNDigits(BuiltinWorkload):
    name = "cnn-digits"
    arch_keys = ("channels",)
    width_key = "channels"
    image_size = 32

    def datasets(self, params: dict[str, Any]) -> tuple[Dataset[Any], Dataset[Any]]:
        images, labels = _digits()
        # Upsampled once, up front (model_inputs), not per batch.
        return _split(self.model_inputs(torch.from_numpy(images)), torch.from_numpy(labels))

    def model_inputs(self, raw: Any) -> torch.Tensor:
        # Upsampled bilinearly to 32x32: 8x8 is too small for three conv+pool stages.
        images = _pixels(raw).view(-1, 1, IMAGE_SIDE, IMAGE_SIDE)
        return F.interpolate(images, size=self.image_size, mode="bilinear", align_corners=False).contiguous()

    def build_model(self, arch: dict[str, Any]) -> nn.Module:
        return CNN(channels=int(arch["channels"]), image_size=self.image_size)
