"""How long each slow test module took in CI, so that pytest-xdist starts the longest first (see conftest.py).

`--dist loadscope` hands whole modules to workers in collection order, two each at first; started last, a
2-minute live-cluster module leaves the other workers idle at the end of the run. The figures only order the
modules: a stale or missing one costs time, never a result. Refresh them from a run's JUnit report:

    pytest ... --junitxml=var/junit.xml && python -m tests.module_seconds var/junit.xml [more.xml ...]
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("module_seconds.json")
MIN_SECONDS = 5.0  # faster modules keep their collection order


def load() -> dict[str, float]:
    try:
        return {str(name): float(seconds) for name, seconds in json.loads(TABLE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def module_of(classname: str) -> str:
    """`tests.jobs.test_x.TestY` -> `tests/jobs/test_x.py` (JUnit names a test by its module and class)."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def main(argv: list[str]) -> None:
    table: dict[str, float] = {}
    for report in map(Path, argv):
        per_module: Counter[str] = Counter()
        for case in ElementTree.parse(report).iter("testcase"):
            per_module[module_of(case.get("classname", ""))] += float(case.get("time") or 0)
        for module, seconds in per_module.items():
            table[module] = max(table.get(module, 0.0), seconds)  # a module of both passes: its slower run
    slow = {module: round(seconds) for module, seconds in sorted(table.items(), key=lambda item: -item[1])
            if seconds >= MIN_SECONDS}
    TABLE.write_text(json.dumps(slow, indent=1) + "\n")
    print(f"{TABLE}: {len(slow)} modules of {MIN_SECONDS:.0f} s or more")


if __name__ == "__main__":
    main(sys.argv[1:])
