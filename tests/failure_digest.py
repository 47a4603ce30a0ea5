"""What failed, in a few lines per test, from pytest's JUnit XML files: `python -m tests.failure_digest FILE...`.

CI's excerpt of a long log keeps its head and tail and cuts the middle, where pytest prints a failure's message
(a live test's message carries the job's record and log). `.ci/run` prints this digest last, so the excerpt keeps it.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HEAD_CHARS, TAIL_CHARS = 1500, 1500  # of a long message: what it waited for and what it saw, and the log's end


def failures(path: Path) -> list[tuple[str, str]]:
    """(test id, message) of each failed or errored test case in one JUnit file."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for outcome in (*case.findall("failure"), *case.findall("error")):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append((test, outcome.get("message") or (outcome.text or "").strip()))
    return found


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        if not path.is_file():
            continue
        for test, message in failures(path):
            if len(message) > HEAD_CHARS + TAIL_CHARS:
                message = f"{message[:HEAD_CHARS]}\n[…]\n{message[-TAIL_CHARS:]}"
            print(f"-- {path.name}: {test}\n{message}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
