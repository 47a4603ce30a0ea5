"""What every page's template needs: the main menu's links the user may open (the rules: apps/accounts/access.py)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

from apps.accounts import access
from apps.accounts.access import Action
from apps.accounts.models import Team


def report_teams(user: Any) -> QuerySet[Team]:
    """The teams whose usage report the user sees (the report page answers 404 when there are none)."""
    return access.restrict(Team.objects.all(), user, Action.VIEW_REPORT)


def nav(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    # Callables: a template asks only when it draws the menu (a page without one makes no query).
    return {"nav": {"usage": lambda: report_teams(user).exists()}}
