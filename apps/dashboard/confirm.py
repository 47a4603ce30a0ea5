"""The confirm step of a destructive action (cancel a job, remove a member).

Its form carries `confirm=yes` only once the user said yes: with JavaScript, a dialog (static/js/console.js, forms
with `data-confirm-text`) adds it; without, the first post answers this confirm page, whose button posts again with it.
The server acts only on a confirmed post, so one stray click (or a replayed form) never destroys anything."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

FIELD = "confirm"


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get(FIELD) == "yes"


def confirm_page(
    request: HttpRequest,
    *,
    title: str,
    question: str,
    button: str,
    back: str,
    keep: dict[str, str] | None = None,
    items: list[str] | None = None,
) -> HttpResponse:
    """The page asking; `keep`: the fields of the first post the confirmed one carries again (a cancel's reason);
    `items`: what the action applies to, listed under the question (the jobs a bulk cancel stops)."""
    return render(
        request,
        "dashboard/confirm.html",
        {
            "title": title,
            "question": question,
            "button": button,
            "back": back,
            "keep": keep or {},
            "items": items or [],
        },
    )
