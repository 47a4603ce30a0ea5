"""Strict parsing of settings from environment variables: a bad value fails at start, naming the variable."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = os.environ.get(name)
    if value is None or value == "":
        if required:
            raise ImproperlyConfigured(f"Environment variable {name} must be set in production mode.")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"Environment variable {name}={raw!r} is not a boolean (use 1/0, true/false).")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"Environment variable {name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"Environment variable {name}={value} must be at least {minimum}.")
    return value


def env_float(name: str, default: float, *, above: float | None = None, minimum: float | None = None) -> float:
    """A finite number; with `above`, strictly greater than it; with `minimum`, at least it."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"Environment variable {name}={raw!r} is not a number.") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"Environment variable {name}={raw!r} is not a finite number.")
    if above is not None and value <= above:
        raise ImproperlyConfigured(f"Environment variable {name}={value:g} must be greater than {above:g}.")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"Environment variable {name}={value:g} must be at least {minimum:g}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def check_url_scheme(name: str, url: str, allowed: tuple[str, ...]) -> str:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in allowed:
        raise ImproperlyConfigured(
            f"Environment variable {name}={url!r} has an unsupported scheme; expected one of: "
            + ", ".join(f"{s}://" for s in allowed)
        )
    return url


def env_networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A comma-separated list of IP addresses or CIDR networks (an address is a network of one)."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"Environment variable {name} has {item!r}, which is no IP address or CIDR network.") from None
    return tuple(networks)


def env_fernet_keys(name: str, secret_key: str, *, required: bool = False) -> list[str]:
    """Fernet keys (32 url-safe base64 bytes each), comma-separated, the first one encrypting.

    Unset outside production: one key derived from `secret_key` (HMAC-SHA256 as a KDF over a high-entropy key),
    so a development console needs no extra variable. It changes with DJANGO_SECRET_KEY, as sessions do.
    """
    raw = env_str(name, None, required=required)
    if raw is None:
        derived = hmac.new(secret_key.encode(), b"gpu-console team secrets v1", hashlib.sha256).digest()
        return [base64.urlsafe_b64encode(derived).decode()]
    keys = [key.strip() for key in raw.split(",") if key.strip()]
    for key in keys:
        try:
            valid = len(base64.urlsafe_b64decode(key.encode())) == 32
        except (ValueError, TypeError):
            valid = False
        if not valid:
            raise ImproperlyConfigured(
                f"Environment variable {name} must list Fernet keys (32 url-safe base64 bytes each, comma-separated); "
                "generate one with python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32))"
                ".decode())'.")
    if not keys:
        raise ImproperlyConfigured(f"Environment variable {name} lists no key.")
    return keys
