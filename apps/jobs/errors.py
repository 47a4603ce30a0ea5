from __future__ import annotations

from apps.accounts.access import AccessDenied


class JobSpecError(Exception):
    """A job spec that can never run or is malformed: field -> message(s). The API answers 400."""

    def __init__(self, errors: dict[str, object]):
        super().__init__(errors)
        self.errors = errors


class JobPermissionError(AccessDenied):
    """The user may see the job or team but not do this to it. The API answers 403."""


class JobStateError(Exception):
    """The action does not apply to the job's current state. The API answers 409."""


class JobRateLimited(Exception):
    """Too many submissions by this user lately. The API answers 429."""
