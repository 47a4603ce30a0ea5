"""CPU-seconds each test module costs, for finding what makes the suite slow on a busy machine.

With CONSOLE_TEST_CPU=FILE set, each pytest process (each xdist worker) appends one JSON line per module to FILE:
the module, its wall seconds, and the CPU-seconds of the process itself and of its children reaped meanwhile (live
clusters, torchrun, job runtimes: a child's figure includes its own reaped children). A module runs whole on one
worker under `--dist loadscope`, so nothing else is counted in its window; processes that outlive their module
(a session's browser) are not counted. Sum the file with `python -m tests.module_cpu FILE`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ENV = "CONSOLE_TEST_CPU"


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _module(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.partition("::")[0]


class ModuleCpu:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started: tuple[str, float, float, float] | None = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
        module = _module(item)
        if self.started is None or self.started[0] != module:
            self.started = (str(module), time.monotonic(), *_cpu())
        yield
        if _module(nextitem) != module:  # its module fixtures were torn down with this item
            name, wall, own, children = self.started
            own_now, children_now = _cpu()
            line = {"module": name, "wall_s": round(time.monotonic() - wall, 1), "own_cpu_s": round(own_now - own, 1),
                    "children_cpu_s": round(children_now - children, 1)}
            with self.path.open("a") as out:
                out.write(json.dumps(line) + "\n")
            self.started = None


def register(config: pytest.Config) -> None:
    if path := os.environ.get(ENV):
        config.pluginmanager.register(ModuleCpu(Path(path)), "module-cpu")


def main(argv: list[str]) -> None:
    total: Counter[str] = Counter()
    rows = [json.loads(line) for path in argv for line in Path(path).read_text().splitlines()]
    for row in rows:
        total[row["module"]] += row["own_cpu_s"] + row["children_cpu_s"]
    print(f"{sum(total.values()):.0f} CPU-seconds in {len(rows)} module runs")
    for module, seconds in total.most_common(40):
        print(f"{seconds:8.1f}  {module}")


if __name__ == "__main__":
    main(sys.argv[1:])
