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
from django.http.request import split_domain_port, validate_host

from apps.telemetry import tickets


def _header(scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return value.decode("latin-1")
    return None


def _origin(scope) -> str | None:
    return _header(scope, b"origin")


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _scheme_host_port(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) origin, the port made explicit; None for anything else."""
    parsed = urlparse(url)
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.hostname or parsed.path or parsed.query:
        return None
    try:
        port = parsed.port or _DEFAULT_PORTS[parsed.scheme]
    except ValueError:  # "127.0.0.1:8000.evil": no port at all
        return None
    return parsed.scheme, parsed.hostname.lower(), port


def _secure(scope) -> bool:
    if scope.get("scheme") == "wss":
        return True
    # Behind a TLS proxy, as Django decides it for pages (SECURE_PROXY_SSL_HEADER).
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, value = proxy_header
        header = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        return (_header(scope, header) or "").split(",")[0].strip() == value
    return False


def _own_origin(scope) -> tuple[str, str, int] | None:
    """The console's origin as this request reached it: the scheme it came in on, and its (allowed) Host."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    return _scheme_host_port(f"{'https' if _secure(scope) else 'http'}://{host}")


def origin_allowed(origin: str, scope=None) -> bool:
    """The page opening the socket is the console's own (scheme, host and port), or a CSRF-trusted origin."""
    claimed = _scheme_host_port(origin)
    if claimed is None:
        return False
    if any(claimed == _scheme_host_port(trusted) for trusted in settings.CSRF_TRUSTED_ORIGINS):
        return True
    return scope is not None and claimed == _own_origin(scope)


@database_sync_to_async
def _user(user_id: int):
    return get_user_model().objects.filter(pk=user_id, is_active=True).first() or AnonymousUser()


class TicketMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            origin = _origin(scope)
            ticket = parse_qs(scope.get("query_string", b"").decode()).get("ticket", [""])[0]
            if origin is not None and not origin_allowed(origin, scope):
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
