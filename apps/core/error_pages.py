"""The console's own 403/404/500 pages in every mode.

With DEBUG off Django renders templates/403.html, 404.html (through `apps.core.views.not_found`) and 500.html. With
DEBUG on (`make run`) it would show its debug pages instead, which people using the console should never see: this
middleware answers those two cases itself. A 403 needs nothing: Django renders 403.html in both modes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseServerError
from django.template import loader

from apps.core.views import not_found

logger = logging.getLogger("django.request")


def server_error_page(note: str = "") -> HttpResponse:
    return HttpResponseServerError(loader.get_template("500.html").render({"debug_note": note}))


class ErrorPagesMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # A URL no route matches never reaches a view (so no process_exception): Django's debug 404 replaced here.
        if (
            settings.DEBUG
            and response.status_code == 404
            and getattr(request, "resolver_match", None) is None
        ):
            return not_found(request, Http404())
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not settings.DEBUG or isinstance(exception, PermissionDenied):
            return None
        if isinstance(exception, Http404):
            return not_found(request, exception)
        if request.path.startswith(("/api/", "/serve/")):
            return None  # API clients keep Django's answer
        # The traceback goes to the log (the terminal of `make run`), as Django's handler would log it.
        logger.error("Internal Server Error: %s", request.path, exc_info=exception)
        return server_error_page("DEBUG is on: the traceback is in the console's log")
