"""Job specs: the API's POST /api/v1/jobs/ body, from a YAML/JSON file and command-line flags."""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from workers.cli.errors import UsageError

SPEC_FIELDS = (
    "name", "team", "kind", "gpus", "gpu_type", "priority", "preset", "workload", "max_steps",
    "time_limit_minutes", "max_retries", "cpus", "memory_gb", "shareable",
    "image", "env", "secrets", "mounts", "code", "shm_gb", "array_size", "array_parallelism",
)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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
    _check_environment(data, name)
    if isinstance(data.get("code"), str) and path != "-":
        # `code: DIR`, a folder to pack, is relative to the spec file, wherever gpuctl runs.
        data["code"] = str(Path(path).parent / data["code"])
    return data


def _check_environment(data: dict[str, Any], name: str) -> None:
    """The shapes gpuctl merges flags into; the console checks the rest."""
    env = data.get("env")
    if env is not None:
        if not isinstance(env, dict):
            raise UsageError(f"{name}: env must be a mapping of NAME: value")
        data["env"] = {str(key): _env_value(value, f"{name}: env.{key}") for key, value in env.items()}
    for key in ("secrets", "mounts"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise UsageError(f"{name}: {key} must be a list of names")
    code = data.get("code")
    if code is not None and not isinstance(code, str | dict):
        raise UsageError(f"{name}: code must be a folder to pack, {{snapshot: ID}} or {{git: {{url: URL, ref: REF}}}}")


def _env_value(value: Any, where: str) -> str:
    """YAML reads `DEBUG: 1` as a number and `FAST: true` as a boolean; the job sees strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise UsageError(f"{where}: a variable's value is a string, number or boolean")


def parse_env(text: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """`--env NAME=VALUE`, or `--env NAME` for this shell's value of NAME (as docker run -e does)."""
    name, sep, value = text.partition("=")
    if not ENV_NAME.match(name):
        raise UsageError(f"--env {text!r}: expected NAME=VALUE with NAME a variable name (letters, digits, _)")
    if not sep:
        if name not in environ:
            raise UsageError(f"--env {name}: {name} is not set here; give --env {name}=VALUE")
        value = environ[name]
    return name, value


def parse_git(text: str) -> dict[str, str]:
    """`--git URL[@REF]`: the ref follows the last @ that comes after the URL's path. So
    `git@host:org/repo.git` has no ref, `git@host:org/repo.git@v2` and `https://host/org/repo@feature/x` do
    (a ref never holds a colon), and `ssh://git@host/org/repo` has none."""
    url, ref = text.strip(), ""
    head, sep, tail = url.rpartition("@")
    if sep and tail and ":" not in tail and any(c in head.split("://", 1)[-1] for c in "/:"):
        url, ref = head, tail
    if not url:
        raise UsageError("--git: give the repository's URL, with @REF for a branch, tag or commit")
    return {"url": url, "ref": ref} if ref else {"url": url}


def _merged(names: list[str], more: list[str]) -> list[str]:
    return list(dict.fromkeys([*names, *more]))


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
    env: list[str] | None = None,
    secrets: list[str] | None = None,
    mounts: list[str] | None = None,
    code_dir: str | None = None,
    git: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The file's spec with the flags on top: set `fields` replace, `--builtin`/`--command`/argv replace the
    workload, `--param` entries merge into the builtin workload's params, `--env` into its env (a flag wins over
    the file's value), `--secret` and `--mount` add names to its lists, `--code`/`--git` replace its code."""
    spec = dict(base)
    spec.update({key: value for key, value in fields.items() if value is not None})
    if env:
        variables = dict(spec.get("env") or {})
        variables.update(parse_env(text, environ if environ is not None else {}) for text in env)
        spec["env"] = variables
    for key, names in (("secrets", secrets), ("mounts", mounts)):
        if names:
            if any(not name.strip() for name in names):
                raise UsageError(f"--{key[:-1]}: give a name")
            spec[key] = _merged(list(spec.get(key) or []), [name.strip() for name in names])
    if code_dir is not None and git is not None:
        raise UsageError("the job's code comes either from a folder (--code) or from git (--git), not both")
    if code_dir is not None:
        spec["code"] = code_dir
    elif git is not None:
        spec["code"] = {"git": parse_git(git)}
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
