"""The built-in workloads named in the catalogue."""

from __future__ import annotations

from .base import BuiltinWorkload
from .digits import CNNDigits, MLPDigits
from .tiny_lm import TinyLMWorkload

BUILTINS: dict[str, BuiltinWorkload] = {w.name: w for w in (MLPDigits(), CNNDigits(), TinyLMWorkload())}


def get(name: str) -> BuiltinWorkload:
    try:
        return BUILTINS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; built-in workloads: {', '.join(BUILTINS)}") from None


__all__ = ["BUILTINS", "BuiltinWorkload", "get"]
