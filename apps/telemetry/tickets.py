"""One-time websocket tickets: a short-lived secret in the cache, exchanged once for the user it names."""

from __future__ import annotations

import secrets

from django.core.cache import cache

TICKET_TTL_S = 30


def _key(ticket: str) -> str:
    return f"ws-ticket:{ticket}"


def issue(user) -> str | None:
    """A new ticket for `user`; None when the cache could not keep it (Redis down: a dead ticket would only be
    refused as "not logged in" a moment later)."""
    ticket = secrets.token_urlsafe(24)
    cache.set(_key(ticket), user.pk, timeout=TICKET_TTL_S)
    if cache.get(_key(ticket)) != user.pk:
        return None
    return ticket


def redeem(ticket: str) -> int | None:
    """The user id the ticket was issued to; the ticket is spent either way."""
    if not ticket or len(ticket) > 100:
        return None
    key = _key(ticket)
    user_id = cache.get(key)
    cache.delete(key)
    return user_id
