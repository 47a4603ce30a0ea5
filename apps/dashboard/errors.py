"""Service refusals (apps.core.errors) as the pages answer them, in one place.

- In a form view, `form_refusal(form, exc)` puts the refusal on the form: each named field's messages beside the
  field, the rest above the form; the view renders the form again (status 400).
- Anywhere else, the middleware answers: not allowed is a 403; the rest is a message on the page the user came
  from (this site's Referer, else the home page), as after a button whose action no longer applies.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.deprecation import MiddlewareMixin
from django.utils.http import url_has_allowed_host_and_scheme

from apps.core.errors import DomainError, InvalidInput, NotAllowed


def form_refusal(form: forms.Form, exc: DomainError) -> None:
    """A form whose fields are not the service's (the job form's workload) maps them in `add_spec_errors`."""
    if not isinstance(exc, InvalidInput):
        form.add_error(None, str(exc))
        return
    add_spec_errors = getattr(form, "add_spec_errors", None)
    if add_spec_errors is not None:
        add_spec_errors(exc.errors)
        return
    for field, problems in exc.errors.items():
        for problem in problems if isinstance(problems, list | tuple) else [problems]:
            form.add_error(field if field in form.fields else None,
                           problem if field in form.fields else f"{field}: {problem}")


def forbidden(request: HttpRequest, message: str) -> HttpResponse:
    """A page's refusal: the console's 403 page (templates/403.html) saying why."""
    return render(request, "403.html", {"message": message}, status=403)


def _back(request: HttpRequest) -> str:
    referer = request.headers.get("Referer", "")
    if url_has_allowed_host_and_scheme(referer, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return referer
    return "/"


class DomainErrorMiddleware(MiddlewareMixin):
    """The answer of a page whose service refused (API views answer through apps.core.api instead)."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DomainError):
            return None
        if request.path.startswith(("/api/", "/serve/")):  # a JSON endpoint outside DRF: the API's answer
            return JsonResponse(exception.body(), status=exception.status)
        if isinstance(exception, NotAllowed):
            return forbidden(request, str(exception))
        text = (", ".join(f"{field}: {problem}" for field, problem in exception.errors.items())
                if isinstance(exception, InvalidInput) else str(exception))
        messages.error(request, text)
        return redirect(_back(request))
