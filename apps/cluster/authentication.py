from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from apps.cluster.models import Host
from apps.cluster.services import host_authenticate


@dataclass(frozen=True)
class HostPrincipal:
    """The identity of an agent: a host, not a person. It holds no role in any team."""

    host: Host
    is_authenticated: bool = True
    is_active: bool = True
    is_staff: bool = False
    pk: None = None

    def get_username(self) -> str:
        return f"host:{self.host.name}"


class HostTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Host <token>`: the agent's credential, accepted only on the agent API."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != b"host":
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header: expected 'Host <token>'.")
        try:
            host = host_authenticate(header[1].decode())
        except UnicodeDecodeError:
            host = None
        if host is None:
            raise exceptions.AuthenticationFailed("Unknown host token.")
        return HostPrincipal(host), host

    def authenticate_header(self, request) -> str:
        return 'Host realm="agent"'


class IsHostAgent(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Host)


class HostTokenScheme(OpenApiAuthenticationExtension):
    target_class = HostTokenAuthentication
    name = "hostToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization", "description": "Host <token>"}
