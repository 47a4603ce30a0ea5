"""Job specs: the API's POST /api/v1/jobs/ body, from a YAML/JSON file and command-line flags."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from workers.cli.errors import UsageError

SPEC_FIELDS = (
    "name", "team", "kind", "gpus", "gpu_type", "priority", "preset", "workload", "max_steps",
    "time_limit_minutes", "max_retries",
)


def load_spec_file(path: str) -> dict[str, Any]:
    """A spec file (`-` for stdin). YAML is a superset of JSON, so one parser reads both."""
    name = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read spec file {name}: {exc.strerror}") from None
    try:
        data = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"{name} is not valid {'JSON' if name.endswith('.json') else 'YAML'}: {exc}") from None
    if data is None:
        raise UsageError(f"{name} is empty")
    if not isinstance(data, dict):
        raise UsageError(f"{name} must hold a mapping of job fields ({', '.join(SPEC_FIELDS)})")
    unknown = sorted(str(key) for key in data if key not in SPEC_FIELDS)
    if unknown:
        raise UsageError(f"{name}: unknown field(s) {', '.join(unknown)}; a job spec takes {', '.join(SPEC_FIELDS)}")
    return data


def parse_param(text: str) -> tuple[str, Any]:
    """`key=value`, the value read as JSON when it parses (`lr=1e-3` is a number, `mode=fast` a string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--param {text!r}: expected KEY=VALUE")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def build_spec(
    base: dict[str, Any],
    fields: dict[str, Any],
    *,
    builtin: str | None = None,
    params: list[str] | None = None,
    command: str | None = None,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """The file's spec with the flags on top: set `fields` replace, `--builtin`/`--command`/argv replace the
    workload, `--param` entries merge into the builtin workload's params."""
    spec = dict(base)
    spec.update({key: value for key, value in fields.items() if value is not None})
    if command is not None and argv:
        raise UsageError("give the command either with --command or after --, not both")
    if command is not None:
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise UsageError(f"--command: {exc}") from None
        if not argv:
            raise UsageError("--command is empty")
    if builtin and argv:
        raise UsageError("a job runs either a built-in workload (--builtin) or a command, not both")
    workload = spec.get("workload")
    if argv:
        if params:
            raise UsageError("--param sets a built-in workload's parameters; a command takes its own arguments")
        spec["workload"] = {"command": list(argv)}
    elif builtin or params:
        current = workload if isinstance(workload, dict) else {}
        name = builtin or current.get("builtin")
        if not name:
            raise UsageError("--param needs a built-in workload: add --builtin NAME (see `gpuctl workloads`)")
        kept = current.get("params") if current.get("builtin") == name else None
        merged = dict(kept) if isinstance(kept, dict) else {}
        merged.update(parse_param(text) for text in params or [])
        spec["workload"] = {"builtin": name, "params": merged}
    if "name" not in spec:
        default = default_name(spec.get("workload"))
        if default:
            spec["name"] = default
    return spec


def default_name(workload: Any) -> str | None:
    """A job without --name is named after what it runs: the builtin, or the command's program."""
    if not isinstance(workload, dict):
        return None
    if isinstance(builtin := workload.get("builtin"), str):
        return builtin
    command = workload.get("command")
    if isinstance(command, list) and command and isinstance(command[0], str):
        return Path(command[0]).name or None
    return None
