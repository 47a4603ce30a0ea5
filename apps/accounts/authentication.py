from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.accounts.services import token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>` or `Authorization: Token <token>` with a personal API token."""

    keywords = (b"bearer", b"token")

    def authenticate(self, request: Request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header: expected 'Bearer <token>'.")
        try:
            secret = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        token = token_authenticate(secret)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}
