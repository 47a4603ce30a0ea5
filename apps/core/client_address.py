"""The client's address of a request: the peer, unless the peer is a trusted proxy (CONSOLE_TRUSTED_PROXIES).

X-Forwarded-For is a header anyone can send: believed from anyone, it lets a client pick the address the login
lockout counts and the audit log records. It is read only when the peer is a trusted proxy, and then from the
right: the first address that is not itself a trusted proxy is the client (what the nearest proxy saw).
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return any(address in network for network in settings.TRUSTED_PROXIES)


def client_address(peer: str | None, forwarded_for: str | None) -> str | None:
    """The client's address given the peer's and the X-Forwarded-For header (None when unknown)."""
    address = _address(peer or "")
    if address is None:
        return None
    if not forwarded_for or not _trusted(address):
        return str(address)
    for hop in reversed(forwarded_for.split(",")):
        forwarded = _address(hop)
        if forwarded is None:
            # A proxy we trust wrote something that is no address: stop at the last address we can vouch for.
            return str(address)
        address = forwarded
        if not _trusted(address):
            return str(address)
    return str(address)


def client_ip(request: HttpRequest | None) -> str | None:
    """The client's address (django-axes' AXES_CLIENT_IP_CALLABLE, the audit log)."""
    if request is None:
        return None
    return client_address(request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR"))
