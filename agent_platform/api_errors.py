"""One error shape for the whole API: ``{"message": str, "extra": {...}}``.

Services raise :class:`ApplicationError` (or Django's ValidationError); DRF's own errors
(authentication, permissions, validation, 404) are rendered in the same shape.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError, RestrictedError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler


class ApplicationError(Exception):
    """A business-rule failure reported to the API caller as a 400 (or ``status_code``)."""

    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, *, extra: dict[str, Any] | None = None, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.extra = extra or {}
        if status_code is not None:
            self.status_code = status_code


class NotFound(ApplicationError):
    """The object does not exist *or belongs to another tenant* (same message for both)."""

    status_code = status.HTTP_404_NOT_FOUND


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApplicationError):
        return Response({"message": exc.message, "extra": exc.extra}, status=exc.status_code)
    if isinstance(exc, (ProtectedError, RestrictedError)):
        users = sorted({f"{obj._meta.verbose_name} {obj.pk}" for obj in exc.args[1]})[:20]
        return Response(
            {"message": "This object is in use and cannot be deleted.", "extra": {"used_by": users}},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(as_serializer_error(exc))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"message": "Validation error.", "extra": {"fields": response.data}}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else response.data
        response.data = {"message": str(detail), "extra": {}}
    return response
