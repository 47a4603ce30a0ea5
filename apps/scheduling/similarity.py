"""Which jobs are "the same program" for run-time prediction (RuntimeHistory groups a user's runs by this key).

The console and the simulator both key by a job's workload: a built-in (a trace job's model counts as one,
TraceJob.workload), or the script that a command runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath


def similarity_key(workload: Mapping[str, object]) -> str:
    """`builtin:<name>`, or `command:<script>`: the first `.py` among the command's first two words (a script run
    by an interpreter), else the command's program name."""
    if "builtin" in workload:
        return f"builtin:{workload['builtin']}"
    command = workload.get("command")
    argv = [str(arg) for arg in command[:2]] if isinstance(command, list | tuple) and command else [""]
    names = [PurePosixPath(arg).name for arg in argv]
    script = next((name for name in names if name.endswith(".py")), names[0])
    return f"command:{script}"
