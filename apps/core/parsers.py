"""JSON request bodies with a bounded nesting depth.

Python's json module recurses once per level: 100,000 `[` raise RecursionError (a 500 in DRF, which only catches
ValueError), and a document just under the interpreter's limit parses but breaks whatever walks it next. Every
body is refused past MAX_JSON_DEPTH levels instead, as a 400 that says so.
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# Far above what any of our bodies needs (job params are capped lower, see apps.jobs.serializers).
MAX_JSON_DEPTH = 64


class JSONTooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"nested deeper than {limit} levels")
        self.limit = limit


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` (parsed JSON) has lists/objects nested more than `limit` levels (iterative: any depth)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def loads_bounded(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads that raises JSONTooDeep (a ValueError) past `limit` levels, never RecursionError."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeep(limit) from None
    if json_depth_exceeds(value, limit):
        raise JSONTooDeep(limit)
    return value


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser (the project's default) with the nesting cap."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels.") from None
        if json_depth_exceeds(data, MAX_JSON_DEPTH):
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels.")
        return data
