"""What a locked-out login gets (django-axes): JSON for the API, a short page for browsers; always 429."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    minutes = round(settings.AXES_COOLOFF_TIME * 60)
    detail = f"Too many failed logins for this account from your address; try again in {minutes} minutes."
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": detail}, status=429)
    else:
        response = HttpResponse(f"<h1>Locked out</h1><p>{detail}</p>", status=429)
    response["Retry-After"] = str(minutes * 60)
    return response
