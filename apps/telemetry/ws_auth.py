"""Websocket authentication: the session for browsers (behind an Origin check), a one-time ticket for API clients.

A request with a foreign Origin is refused before anything else. Without an Origin header (not a browser) the
session cookie is ignored and only a ticket authenticates, so no other site can ride on a user's cookies.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.http.request import validate_host

from apps.telemetry import tickets


def _origin(scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"origin":
            return value.decode("latin-1")
    return None


def origin_allowed(origin: str) -> bool:
    parsed = urlparse(origin)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        return False
    return validate_host(parsed.hostname, settings.ALLOWED_HOSTS) or origin in settings.CSRF_TRUSTED_ORIGINS


@database_sync_to_async
def _user(user_id: int):
    return get_user_model().objects.filter(pk=user_id, is_active=True).first() or AnonymousUser()


class TicketMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            origin = _origin(scope)
            ticket = parse_qs(scope.get("query_string", b"").decode()).get("ticket", [""])[0]
            if origin is not None and not origin_allowed(origin):
                await send({"type": "websocket.close", "code": 4403})
                return
            if ticket:
                user_id = tickets.redeem(ticket)
                scope["user"] = await _user(user_id) if user_id else AnonymousUser()
                scope["auth"] = "ticket"
            elif origin is None:
                scope["user"] = AnonymousUser()
                scope["auth"] = "none"
        return await super().__call__(scope, receive, send)


def websocket_auth(inner):
    """Session auth for browsers (AuthMiddlewareStack), then the Origin rule and tickets on top of it."""
    return AuthMiddlewareStack(TicketMiddleware(inner))
