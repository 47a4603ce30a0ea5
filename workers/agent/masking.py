"""Masks secret values in a job's output before it reaches output.log and the console.

The output arrives in chunks of any size, so a value may be split across two reads: the mask holds back the
longest tail of what it has seen that could still begin a secret, and releases it once the next chunk (or the
end of the output) decides.
"""

from __future__ import annotations

from collections.abc import Iterable

MASK = "****"
MIN_SECRET_CHARS = 4  # shorter values would mask ordinary text ("1", "on") and reveal nothing worth hiding


class SecretMask:
    def __init__(self, values: Iterable[str]) -> None:
        # Longest first: a value that contains another is masked whole.
        self.values = sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        self._held = ""

    def __bool__(self) -> bool:
        return bool(self.values)

    def feed(self, text: str) -> str:
        """What of `text` (after what was held back) can be released now, masked."""
        if not self.values:
            return text
        text = self._replace(self._held + text)
        keep = self._open_prefix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The end of the output: release what was held back."""
        held, self._held = self._held, ""
        return held

    def _replace(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, MASK)
        return text

    def _open_prefix(self, text: str) -> int:
        """Length of the longest end of `text` that is the start of some secret (0: none)."""
        longest = 0
        for value in self.values:
            for size in range(min(len(value) - 1, len(text)), longest, -1):
                if value.startswith(text[-size:]):
                    longest = size
                    break
        return longest
