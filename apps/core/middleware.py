"""A database outage answers 503 with Retry-After, never a 500 with a traceback (pages and API alike)."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

logger = logging.getLogger(__name__)


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        logger.warning("database unavailable during %s %s: %s", request.method, request.path, exception)
        detail = "The console's database is unavailable; try again shortly."
        if request.path.startswith(("/api/", "/serve/")) or "json" in request.headers.get("Accept", ""):
            response: HttpResponse = JsonResponse({"detail": detail}, status=503)
        else:
            response = HttpResponse(f"<h1>Service unavailable</h1><p>{detail}</p>", status=503)
        response["Retry-After"] = "5"
        return response
