"""Token secrets: generation and hashing. Tokens carry 256 random bits, so a fast digest is safe to store."""

from __future__ import annotations

import hashlib
import secrets


def new_secret(kind: str) -> str:
    return f"{kind}_{secrets.token_urlsafe(32)}"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
