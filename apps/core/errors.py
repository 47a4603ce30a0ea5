"""The errors services raise when an action cannot be done, each with the answer it gets.

Services raise these; the API maps them once (`apps.core.api.exception_handler`) and the pages once
(`apps.dashboard.errors`). A view never catches them to pick a status code itself.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied


class DomainError(Exception):
    """An action that cannot be done as asked. `status` is the HTTP answer; the message is for the user."""

    status = 400

    def body(self) -> dict[str, Any]:
        """The answer's JSON body: a detail (InvalidInput names its fields instead)."""
        return {"detail": str(self)}


class InvalidInput(DomainError):
    """Input that can never be carried out: field -> message(s), the same shape as a DRF validation error."""

    def __init__(self, errors: dict[str, Any]) -> None:
        super().__init__(errors)
        self.errors = errors

    def body(self) -> dict[str, Any]:
        return self.errors


class NotAllowed(DomainError, PermissionDenied):
    """The user may see the object but not do this to it (Django's and DRF's PermissionDenied too: 403)."""

    status = 403


class WrongState(DomainError):
    """The action does not apply to the object's current state (already finished, already decided …)."""

    status = 409


class RateLimited(DomainError):
    """Too many of these lately; try again after `retry_after_s` seconds."""

    status = 429

    def __init__(self, message: str, retry_after_s: int = 60) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
