"""tiny-lm: a character-level transformer trained on the text shipped in workers/runtime/data/."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from .base import BuiltinWorkload

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"
EVAL_FRACTION = 0.1


@lru_cache(maxsize=1)
def corpus() -> tuple[str, str]:
    """(text, vocabulary): the vocabulary is the sorted set of characters, so it is the same everywhere."""
    text = CORPUS.read_text(encoding="utf-8")
    return text, "".join(sorted(set(text)))


def encode(text: str, vocab: str) -> torch.Tensor:
    index = {ch: i for i, ch in enumerate(vocab)}
    return torch.tensor([index.get(ch, 0) for ch in text], dtype=torch.long)


def decode(ids: torch.Tensor, vocab: str) -> str:
    return "".join(vocab[i] for i in ids.tolist())


class CharChunks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """(seq_len inputs, next-character targets) windows over `ids`, starting every `stride` characters."""

    def __init__(self, ids: torch.Tensor, seq_len: int, stride: int) -> None:
        self.ids = ids
        self.seq_len = seq_len
        self.starts = list(range(0, max(1, len(ids) - seq_len - 1), stride))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.starts[index]
        window = self.ids[start:start + self.seq_len + 1]
        return window[:-1], window[1:]


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, length: int, temperature: float = 0.8,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        ids = prompt
        for _ in range(length):
            logits = self(ids[:, -self.seq_len:])[:, -1].float() / temperature
            next_id = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            ids = torch.cat([ids, next_id], dim=1)
        return ids


def _heads_for(d_model: int, heads: int) -> int:
    # Keep the model buildable whatever the width (a distillation student may be narrower).
    heads = max(1, min(heads, d_model))
    while d_model % heads:
        heads -= 1
    return heads


class TinyLMWorkload(BuiltinWorkload):
    name = "tiny-lm"
    arch_keys = ("layers", "d_model", "heads", "seq_len")
    width_key = "d_model"

    def datasets(self, params: dict[str, Any]) -> tuple[Dataset[Any], Dataset[Any]]:
        text, _ = corpus()
        ids = self.model_inputs(text)
        cut = int(len(ids) * (1 - EVAL_FRACTION))
        seq_len = int(params["seq_len"])
        return (CharChunks(ids[:cut], seq_len, stride=max(1, seq_len // 2)),
                CharChunks(ids[cut:], seq_len, stride=seq_len))

    def model_inputs(self, raw: Any) -> torch.Tensor:
        """Token ids of a text; characters outside the corpus's vocabulary map to its first symbol."""
        return encode(str(raw), corpus()[1])

    def decode_outputs(self, output: torch.Tensor) -> list[Any]:
        """The text of each row of token ids (a 1-d tensor is one row)."""
        _, vocab = corpus()
        rows = [output.reshape(-1)] if output.dim() <= 1 else list(output.reshape(-1, output.shape[-1]))
        return [decode(row.cpu(), vocab) for row in rows]

    def build_model(self, arch: dict[str, Any]) -> nn.Module:
        d_model = int(arch["d_model"])
        return TinyLM(vocab_size=len(corpus()[1]), d_model=d_model, layers=int(arch["layers"]),
                      heads=_heads_for(d_model, int(arch.get("heads", 4))), seq_len=int(arch["seq_len"]))

    def describe(self, model: nn.Module, output: dict[str, Any]) -> None:
        super().describe(model, output)
        if not isinstance(model, TinyLM):
            return
        device = next(model.parameters()).device
        prompt = self.model_inputs("The keeper ").unsqueeze(0).to(device)
        was_training = model.training
        model.eval()
        sample = model.generate(prompt, 80, generator=torch.Generator(device=device).manual_seed(0))
        model.train(was_training)
        output["sample"] = self.decode_outputs(sample[0])[0]
