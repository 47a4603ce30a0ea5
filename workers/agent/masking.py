"""Masks secret values in a job's output before it reaches output.log and the console.

The output arrives in chunks of any size, so a value may be split across two reads: the mask holds back the
longest tail of what it has seen that could still begin a secret, and releases it once the next chunk (or the
end of the output) decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "****"
MIN_SECRET_CHARS = 4  # shorter values would mask ordinary text ("1", "on") and reveal nothing worth hiding


class SecretMask:
    def __init__(self, values: Iterable[str]) -> None:
        # Longest first: at any position the longest value wins (one that contains another is masked whole).
        self.values = sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, self.values))) if self.values else None
        self._held = ""

    def __bool__(self) -> bool:
        return bool(self.values)

    def feed(self, text: str) -> str:
        """What of `text` (after what was held back) can be released now, masked."""
        if self._pattern is None:
            return text
        buffer = self._held + text
        return self._release(buffer, len(buffer) - self._open_suffix(buffer))

    def flush(self) -> str:
        """The end of the output: release what was held back (masked: it may hold a whole shorter value)."""
        if self._pattern is None:
            return ""
        buffer, self._held = self._held, ""
        return self._release(buffer, len(buffer))

    def _release(self, buffer: str, hold_at: int) -> str:
        """Mask every value that starts before `hold_at`; keep the rest back."""
        assert self._pattern is not None
        parts, position = [], 0
        for match in self._pattern.finditer(buffer):
            if match.start() >= hold_at:
                break
            parts += [buffer[position:match.start()], MASK]
            position = match.end()
        end = max(hold_at, position)
        parts.append(buffer[position:end])
        self._held = buffer[end:]
        return "".join(parts)

    def _open_suffix(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper start of some secret (0: none)."""
        longest = 0
        for value in self.values:
            for size in range(min(len(value) - 1, len(text)), longest, -1):
                if value.startswith(text[-size:]):
                    longest = size
                    break
        return longest
