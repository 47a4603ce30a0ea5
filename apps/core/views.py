from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A URL that matches no route: JSON under /api/ and /serve/ (what API clients parse), the HTML page elsewhere.

    e.g. /api/v1/teams/a.b/: the router's slugs exclude dots, so no view, and so no DRF, ever sees it."""
    if request.path.startswith(("/api/", "/serve/")):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)
