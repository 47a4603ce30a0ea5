"""A bare endpoint for benchmarks/submit_load.py: token auth, one row-locked insert, nothing else.

It is the ceiling the real submit endpoint is measured against; routed only with CONSOLE_BENCHMARK_ENDPOINTS=1
(never in production mode).
"""

from __future__ import annotations

from django.db import transaction
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.models import AuditEvent
from apps.quotas.models import TeamQuota


class BareInsertView(APIView):
    def post(self, request: Request) -> Response:
        with transaction.atomic():
            quota = TeamQuota.objects.select_for_update(of=("self",)).filter(team__memberships__user=request.user).first()
            event = AuditEvent.objects.create(action=AuditEvent.Action.USER_CHANGED, actor=request.user,
                                              target=f"bench {quota.pk if quota else '-'}")
        return Response({"id": event.pk}, status=status.HTTP_201_CREATED)
