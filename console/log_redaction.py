"""Keep one-time websocket tickets out of the logs.

API clients open `/ws/...?ticket=...`; the ASGI server logs every request line with its query string (uvicorn's
access log, and its websocket handshake lines on `uvicorn.error` even with --no-access-log). A ticket is redeemed
within seconds, but a log reader who is faster, or a ticket that failed to open a socket, is a login. The filter
rewrites the ticket's value to `[redacted]` in the record's message and arguments, keeping their shape (uvicorn's
access formatter reads its arguments by position).
"""

from __future__ import annotations

import logging
import re
from typing import Any

_TICKET = re.compile(r"(?i)((?:^|[?&;])ticket=)[^&#\s\"']*")
REDACTED = "[redacted]"
# The loggers of the ASGI servers that write request lines: uvicorn's, and daphne's for `manage.py runserver`.
REQUEST_LOGGERS = ("uvicorn.access", "uvicorn.error", "django.channels.server", "daphne.server", "daphne.ws_protocol")


def redact(text: str) -> str:
    return _TICKET.sub(rf"\g<1>{REDACTED}", text) if "ticket=" in text.lower() else text


def _redact_arg(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


class RedactTicketFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _redact_arg(value) for key, value in record.args.items()}
        return True


def install() -> None:
    """Add the filter to the request loggers (once: the ASGI module may be imported again under --reload)."""
    for name in REQUEST_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTicketFilter) for f in logger.filters):
            logger.addFilter(RedactTicketFilter())
