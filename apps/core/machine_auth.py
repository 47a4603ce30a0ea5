"""Credentials of callers that are not people (a host's agent, a running job): `Authorization: <Keyword> <token>`.

Each is accepted only by its own endpoints; its principal holds no role in any team.
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request


class MachinePrincipal:
    """What DRF and Django ask of `request.user`, for a caller that is no person."""

    is_authenticated = True
    is_active = True
    is_staff = False
    pk = None


class KeywordTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: <keyword> <token>`: subclasses name the keyword and find who the token belongs to."""

    keyword = ""
    unknown = "Unknown token."

    def resolve(self, token: str) -> tuple[Any, Any] | None:
        """(principal, auth) of the token's owner, or None. Every subclass defines it."""
        raise TypeError(f"{type(self).__name__} must define resolve()")

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None  # another scheme: another authenticator's business
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(f"Invalid Authorization header: expected '{self.keyword} <token>'.")
        try:
            found = self.resolve(header[1].decode())
        except UnicodeDecodeError:
            found = None
        if found is None:
            raise exceptions.AuthenticationFailed(self.unknown)
        return found

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="{self.keyword.lower()}"'
