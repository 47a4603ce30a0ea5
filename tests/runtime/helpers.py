"""Models, data and process helpers shared by the runtime tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parents[2]


class TinyMLP(nn.Module):
    def __init__(self, width: int = 16, inputs: int = 8, classes: int = 4, depth: int = 2) -> None:
        super().__init__()
        dims = [inputs] + [width] * depth
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TinyConvNet(nn.Module):
    def __init__(self, channels: int = 4, classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class TinyBatchNormNet(nn.Module):
    """A flat-input model with a BatchNorm layer (what FSDP2 mixed precision cannot cast on the CPU)."""

    def __init__(self, width: int = 16, inputs: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(inputs, width), nn.BatchNorm1d(width), nn.ReLU())])
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks[0](x))


def tiny_data(samples: int = 64, inputs: int = 8, classes: int = 4, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, inputs, generator=generator)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return TensorDataset(x, y % classes)


def tiny_loader(batch_size: int = 16, samples: int = 64, shuffle: bool = True) -> DataLoader:
    return DataLoader(tiny_data(samples), batch_size=batch_size, shuffle=shuffle)


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSOLE_")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def run_python(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=subprocess_env(env), capture_output=True,
                          text=True, timeout=timeout)


def torchrun(args: list[str], env: dict[str, str], nproc: int = 2,
             timeout: float = 180) -> subprocess.CompletedProcess[str]:
    # --standalone: the rendezvous store binds a port the OS picks, so parallel runs cannot collide.
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return run_python([*launcher, *args], env, timeout=timeout)
