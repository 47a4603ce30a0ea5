"""Encryption at rest of team secrets: Fernet (AES-128-CBC + HMAC-SHA256, `cryptography`), keys from settings.

settings.CONSOLE_SECRETS_KEYS lists the keys, the first encrypting and every one decrypting (MultiFernet), so an
operator rotates the key by putting a new one first and re-encrypting the rows (`manage.py reencrypt_secrets`).
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

__all__ = ["InvalidToken", "decrypt", "encrypt", "reencrypt"]


@lru_cache(maxsize=4)
def _box(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def _current() -> MultiFernet:
    # Keyed by the settings' value, so a test that overrides the keys gets its own box.
    return _box(tuple(settings.CONSOLE_SECRETS_KEYS))


def encrypt(value: str) -> str:
    return _current().encrypt(value.encode()).decode("ascii")


def decrypt(ciphertext: str) -> str:
    """The plain value; InvalidToken when none of the keys opens it (a lost or removed key)."""
    return _current().decrypt(ciphertext.encode("ascii")).decode()


def reencrypt(ciphertext: str) -> str:
    """The same value encrypted with the first key (key rotation)."""
    return _current().rotate(ciphertext.encode("ascii")).decode("ascii")
