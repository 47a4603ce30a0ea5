from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import permissions
from rest_framework.views import APIView

from apps.cluster.models import Host
from apps.cluster.services import host_authenticate
from apps.core.machine_auth import KeywordTokenAuthentication, MachinePrincipal


@dataclass(frozen=True)
class HostPrincipal(MachinePrincipal):
    """The identity of an agent: a host, not a person. It holds no role in any team."""

    host: Host

    def get_username(self) -> str:
        return f"host:{self.host.name}"


class HostTokenAuthentication(KeywordTokenAuthentication):
    """`Authorization: Host <token>`: the agent's credential, accepted only on the agent API."""

    keyword = "Host"
    unknown = "Unknown host token."

    def resolve(self, token: str) -> tuple[HostPrincipal, Host] | None:
        host = host_authenticate(token)
        return (HostPrincipal(host), host) if host is not None else None

    def authenticate_header(self, request) -> str:
        return 'Host realm="agent"'


class IsHostAgent(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Host)


class AgentView(APIView):
    """The base of every endpoint a host's agent calls (registration, heartbeats, job reports, telemetry)."""

    authentication_classes = [HostTokenAuthentication]
    permission_classes = [IsHostAgent]


class HostTokenScheme(OpenApiAuthenticationExtension):
    target_class = HostTokenAuthentication
    name = "hostToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization", "description": "Host <token>"}
