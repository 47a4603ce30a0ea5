"""Which jobs are "the same program" for run-time prediction (RuntimeHistory groups runs by this key), and how
much work a job asks of it.

The console and the simulator both key by a job's workload: a built-in with the params that shape each step (a
trace job's model counts as one, TraceJob.workload), or the script that a command runs. The params that only say
how long to go on (epochs, inference passes) are the job's work size instead: a run of 1,000 epochs is predicted
from similar runs' time per epoch, not from their run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath

# Params that set how much work a built-in does (multiplied together), and params that change neither the work
# nor the time of a step.
WORK_PARAMS = ("epochs", "infer_passes")
NEUTRAL_PARAMS = ("seed", "lr", "checkpoint")


def _params(workload: Mapping[str, object]) -> Mapping[str, object]:
    params = workload.get("params")
    return params if isinstance(params, Mapping) else {}


def work_size(workload: Mapping[str, object]) -> float | None:
    """The product of a built-in's work params that the job sets (None: it sets none, or is no built-in)."""
    if "builtin" not in workload:
        return None
    values = [
        v for name in WORK_PARAMS if isinstance(v := _params(workload).get(name), int | float) and v > 0
    ]
    if not values:
        return None
    size = 1.0
    for value in values:
        size *= float(value)
    return size


def similarity_key(workload: Mapping[str, object]) -> str:
    """`builtin:<name>` (followed by its shaping params, sorted, if it sets any), or `command:<script>`: the first `.py` among the command's first two words (a script run
    by an interpreter), else the command's program name."""
    if "builtin" in workload:
        params = _params(workload)
        shape = sorted(
            (str(k), str(v)) for k, v in params.items() if k not in WORK_PARAMS and k not in NEUTRAL_PARAMS
        )
        suffix = "".join(f" {k}={v}" for k, v in shape)
        return f"builtin:{workload['builtin']}{suffix}"
    command = workload.get("command")
    argv = [str(arg) for arg in command[:2]] if isinstance(command, list | tuple) and command else [""]
    names = [PurePosixPath(arg).name for arg in argv]
    script = next((name for name in names if name.endswith(".py")), names[0])
    return f"command:{script}"
