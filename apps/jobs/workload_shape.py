"""The shape a job's workload must have, checked by job_submit for the API, the pages and the CLI alike.

`{"builtin": NAME, "params": {...}}` or `{"command": [argv...]}` from users; `{"serve": {...}}` only from the
serving app, which builds a replica's workload itself. Whether the named workload exists and takes the params is
the catalogue's check, which follows this one (submission._check_workload).
"""

from __future__ import annotations

from typing import Any

from apps.core.parsers import json_depth_exceeds

MAX_ARGS = 256
MAX_ARG_LENGTH = 4096
# A built-in workload's params are a few flat values; nesting this deep is no configuration (the runtime, the
# database's jsonb and every page that shows the job walk it).
MAX_PARAMS_DEPTH = 32

Problem = list[str] | dict[str, Any]


def params_depth_error(params: Any) -> str | None:
    if json_depth_exceeds(params, MAX_PARAMS_DEPTH):
        return f"Nested deeper than {MAX_PARAMS_DEPTH} levels."
    return None


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in key or _has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


def _unknown(keys: set[str]) -> dict[str, Any]:
    return {name: ["Unknown field."] for name in sorted(keys)}


def checked_workload(workload: Any, *, replica: bool = False) -> tuple[dict[str, Any], Problem | None]:
    """The workload in its one form (params always present), or what is wrong with it, for the "workload" field."""
    if not isinstance(workload, dict):
        return {}, ['Expected {"builtin": NAME, "params": {...}} or {"command": [argv...]}.']
    keys = set(workload)
    if replica and "serve" in workload:
        return workload, None
    if {"builtin", "command"} <= keys:
        return {}, ["Give either 'builtin' or 'command', not both."]
    if "builtin" in workload:
        return _builtin(workload, keys)
    if "command" in workload:
        return _command(workload, keys)
    return {}, ["Give 'builtin' (a built-in workload) or 'command' (an argv list)."]


def _builtin(workload: dict[str, Any], keys: set[str]) -> tuple[dict[str, Any], Problem | None]:
    if keys - {"builtin", "params"}:
        return {}, _unknown(keys - {"builtin", "params"})
    if not isinstance(workload["builtin"], str) or not workload["builtin"]:
        return {}, {"builtin": ["Must be a workload name."]}
    params = workload.get("params", {})
    if not isinstance(params, dict):
        return {}, {"params": ["Must be an object."]}
    too_deep = params_depth_error(params)
    if too_deep:
        return {}, {"params": [too_deep]}
    # A NUL byte is no path, name or number: PostgreSQL's jsonb refuses it (a 500), the agent's exec too.
    with_nul = sorted(repr(name) if "\x00" in name else name for name, value in params.items()
                      if "\x00" in name or _has_nul(value))
    if with_nul:
        return {}, {"params": {name: ["Must not contain NUL bytes."] for name in with_nul}}
    return {"builtin": workload["builtin"], "params": params}, None


def _command(workload: dict[str, Any], keys: set[str]) -> tuple[dict[str, Any], Problem | None]:
    if keys - {"command"}:
        return {}, _unknown(keys - {"command"})
    argv = workload["command"]
    if not isinstance(argv, list) or not argv or not all(isinstance(arg, str) for arg in argv):
        return {}, {"command": ["Must be a non-empty list of strings (argv)."]}
    if len(argv) > MAX_ARGS:
        return {}, {"command": [f"At most {MAX_ARGS} arguments."]}
    if any(len(arg) > MAX_ARG_LENGTH or "\x00" in arg for arg in argv):
        return {}, {"command": [f"Arguments must be at most {MAX_ARG_LENGTH} characters, without NUL bytes."]}
    if not argv[0].strip():
        return {}, {"command": ["The program name is empty."]}
    return {"command": argv}, None
