from __future__ import annotations

from apps.accounts.access import AccessDenied
from apps.core.errors import InvalidInput, RateLimited, WrongState


class JobSpecError(InvalidInput):
    """A job spec that can never run or is malformed: field -> message(s). The API answers 400."""


class JobPermissionError(AccessDenied):
    """The user may see the job or team but not do this to it. The API answers 403."""


class JobStateError(WrongState):
    """The action does not apply to the job's current state. The API answers 409."""


class JobRateLimited(RateLimited):
    """Too many submissions by this user lately. The API answers 429."""
