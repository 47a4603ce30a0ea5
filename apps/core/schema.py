"""OpenAPI: the error answers every operation may give, documented once instead of on every view.

drf-spectacular documents only the success answer of each operation. This post-processing hook adds what DRF and
our own handlers answer otherwise, so clients (and schemathesis) can rely on the schema for every status code:

- 400: the operation takes a body or query parameters (field name -> messages, or `detail` for a parse error);
- 401 and 403: it needs authentication (no or bad credentials; the role does not allow it);
- 404: it has path parameters (no such object, or not yours: never 403) or pages (`?page=` past the end);
- 503: the database is unavailable (apps.core.api.exception_handler, apps.core.middleware).

Operation-specific answers (409 for a state conflict, 429 for a rate limit) are declared on their views with
`extend_schema(responses={..., 409: ErrorSerializer})`.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

ERROR_REF = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA = {
    "type": "object",
    "description": "An error: `detail` says what went wrong.",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
VALIDATION_ERROR_SCHEMA = {
    "type": "object",
    "description": "Field name -> list of messages (nested for nested fields); `non_field_errors` for the "
                   "whole body, `detail` for a body that could not be parsed.",
    "additionalProperties": True,
}
METHODS = {"get", "put", "post", "patch", "delete", "head", "options", "trace"}


class ErrorSerializer(serializers.Serializer):
    """The body of an error answer: `{"detail": "..."}`."""

    detail = serializers.CharField()

    class Meta:
        ref_name = "Error"


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _parameters(operation: dict[str, Any], where: str) -> list[dict[str, Any]]:
    return [p for p in operation.get("parameters", []) if p.get("in") == where]


def _anonymous_allowed(operation: dict[str, Any]) -> bool:
    return any(requirement == {} for requirement in operation.get("security", [{}]))


def add_error_responses(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR_SCHEMA)
    schemas.setdefault("ValidationError", VALIDATION_ERROR_SCHEMA)
    validation_ref = {"$ref": "#/components/schemas/ValidationError"}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in METHODS:
                continue
            responses = operation.setdefault("responses", {})
            query = _parameters(operation, "query")
            if "requestBody" in operation or query:
                responses.setdefault("400", _json(validation_ref, "Invalid input: the messages say which field."))
            if not _anonymous_allowed(operation):
                responses.setdefault("401", _json(ERROR_REF, "Not logged in, or the credentials are invalid."))
                responses.setdefault("403", _json(ERROR_REF, "The credentials do not allow this."))
            if _parameters(operation, "path") or any(p["name"] == "page" for p in query):
                responses.setdefault("404", _json(ERROR_REF, "No such object (or not visible to you), or no "
                                                             "such page."))
            responses.setdefault("503", _json(ERROR_REF, "The database is unavailable; try again shortly."))
    return result


def drop_slashed_twins(endpoints: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A route that also answers with a trailing slash (the router's form of an artifact download) is
    documented once, without it."""
    paths = {(endpoint[0], endpoint[2]) for endpoint in endpoints}
    return [endpoint for endpoint in endpoints
            if not (endpoint[0].endswith("}/") and (endpoint[0][:-1], endpoint[2]) in paths)]
