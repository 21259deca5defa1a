"""The API's OpenAPI schema, kept true to what the API answers (drf-spectacular).

- :func:`add_error_responses` (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``) documents
  the ``{message, extra}`` error answers (component ``Error``) on every ``/api/v1/``
  operation: 400, 401, 403, 404, 429 and 503 everywhere, 413 and 415 where a body is sent, 409 on
  writes (an object in use, a state conflict).
- :func:`paginated` names the page object ``{count, next, previous, results}`` that
  ``PageNumberPagination`` answers, for views that paginate by hand.
- :class:`StrictCharField`: a text field that refuses non-strings (DRF's ``CharField``
  turns ``{"name": 0}`` into ``"0"``).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

ERROR_COMPONENT = "Error"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every API error: a sentence for people and details for programs "
                   "(validation errors: extra.fields maps each field to its messages).",
    "properties": {
        "message": {"type": "string"},
        "extra": {"type": "object", "additionalProperties": {}},
    },
    "required": ["message", "extra"],
}
_DESCRIPTIONS = {
    "400": "Invalid input (validation error, malformed or too deeply nested JSON).",
    "401": "Not authenticated, or the token is invalid or revoked.",
    "403": "Authenticated but not allowed (role, tenant, CSRF).",
    "404": "No such object for this caller (also another tenant's: the same answer).",
    "409": "Conflict with the object's state (in use, already decided, run ended).",
    "413": "Request body larger than DATA_UPLOAD_MAX_MEMORY_SIZE (extra.max_bytes).",
    "415": "Unsupported request content type.",
    "429": "Throttled; see the Retry-After header.",
    "503": "The server is too busy to take the request (no database connection free in time); "
           "send it again after the Retry-After header's seconds.",
}
_ALWAYS = ("400", "401", "403", "404", "429", "503")
_WITH_BODY = ("413", "415")
_WRITES = ("409",)


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: add the ``Error`` component and the error
    responses (see the module docstring) to every ``/api/v1/`` operation that does not
    document that status already. Returns ``result`` (the schema dict), changed in place."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault(ERROR_COMPONENT, ERROR_SCHEMA)
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            codes = list(_ALWAYS)
            if method in {"post", "put", "patch"}:
                codes += _WITH_BODY
            if method in {"post", "put", "patch", "delete"}:
                codes += _WRITES
            responses = operation.setdefault("responses", {})
            for code in codes:
                responses.setdefault(code, {"description": _DESCRIPTIONS[code],
                                            "content": {"application/json": {"schema": ref}}})
    return result


def paginated(name: str, item: serializers.BaseSerializer) -> serializers.Serializer:
    """The schema of a ``PageNumberPagination`` page of ``item`` (a serializer instance,
    ``many=False``): ``{count: int, next: url|null, previous: url|null, results: [item]}``,
    as component ``name``."""
    return inline_serializer(name, {
        "count": serializers.IntegerField(),
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": serializers.ListField(child=item),
    })


class StrictCharField(serializers.CharField):
    """A ``CharField`` that accepts only JSON strings: ``0``, ``true``, lists and objects are
    a validation error (400), not coerced to text."""

    default_error_messages = {"invalid": "Not a valid string."}

    def to_internal_value(self, data: Any) -> str:
        """``data`` if it is a ``str`` (then CharField's rules), else ``ValidationError``."""
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)
