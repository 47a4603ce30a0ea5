"""Shared API pieces: pagination and an exception handler that never answers 500 for a database outage."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.core.errors import DomainError, InvalidInput, RateLimited

logger = logging.getLogger(__name__)


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500


def domain_error_response(exc: DomainError) -> Response:
    """A service's refusal as the API answers it: a 400 names the fields, the others carry a detail."""
    if isinstance(exc, InvalidInput):
        return Response(ValidationError(exc.errors).detail, status=exc.status)  # messages as lists, as DRF
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, RateLimited) else None
    return Response(exc.body(), status=exc.status, headers=headers)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return domain_error_response(exc)
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    if isinstance(exc, OperationalError | InterfaceError):
        logger.warning("database unavailable: %s", exc)
        return Response(
            {"detail": "The console's database is unavailable; try again shortly."},
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, DatabaseError):
        logger.exception("database error")
    return None
