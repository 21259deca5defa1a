"""One error shape for the whole API: ``{"message": str, "extra": {...}}``.

Services raise :class:`ApplicationError` (or Django's ValidationError); DRF's own errors
(authentication, permissions, validation, 404) are rendered in the same shape.

Errors that never reach a DRF view are put in the same shape by :class:`ApiErrorShapeMiddleware`
for every path under ``/api/``: a URL no route matches (``/api/v1/sessions/-1/``) is a JSON
404, a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` a JSON 413, a crash a JSON 500 (never
Django's HTML or debug pages).

A request that found no database connection free in the process's pool within its timeout
(``DB_POOL_MAX_SIZE`` connections, 30 s: a burst of requests larger than the process can
serve) is a 503 with ``Retry-After`` (:data:`BUSY_RETRY_AFTER_SECONDS`), not a 500: nothing
is wrong with the request, and the client can send it again.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg_pool
from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError, RestrictedError
from django.http import Http404, HttpRequest, HttpResponseBase, JsonResponse
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


BUSY_RETRY_AFTER_SECONDS: Final[int] = 5
"""``Retry-After`` of a 503 for an exhausted database pool (seconds)."""


def _pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is the database pool's timeout (psycopg_pool's ``PoolTimeout``, as
    Django raises it: an ``OperationalError`` caused by it)."""
    return isinstance(exc, psycopg_pool.PoolTimeout) or isinstance(exc.__cause__, psycopg_pool.PoolTimeout)


def _busy_body() -> dict[str, Any]:
    return {"message": "The server is busy: no database connection was free in time. Send the request again shortly.",
            "extra": {"retry_after_seconds": BUSY_RETRY_AFTER_SECONDS}}


def _too_big_body() -> dict[str, Any]:
    return {"message": "Request body too large.",
            "extra": {"max_bytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's ``EXCEPTION_HANDLER``: every API error as ``{"message": str, "extra": {...}}``.

    ApplicationError → its status; ProtectedError/RestrictedError → 409 (``extra.used_by``);
    Django/DRF ValidationError → 400 (``extra.fields``: field → messages); a body over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` → 413 (``extra.max_bytes``); Http404/PermissionDenied and
    DRF's own exceptions (401, 403, 404, 405, 415, 429, ...) → their status with ``extra`` {};
    an exhausted database pool → 503 with ``Retry-After`` (``extra.retry_after_seconds``).
    Anything else returns None (Django's 500, shaped by :class:`ApiErrorShapeMiddleware`).
    """
    if isinstance(exc, RequestDataTooBig):
        return Response(_too_big_body(), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if _pool_exhausted(exc):
        return Response(_busy_body(), status=status.HTTP_503_SERVICE_UNAVAILABLE,
                        headers={"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)})
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


API_PATH_PREFIX = "/api/"
_KEPT_HEADERS = ("Retry-After", "WWW-Authenticate", "Allow", "Vary")


def _is_json(response: HttpResponseBase) -> bool:
    return (response.get("Content-Type") or "").startswith("application/json")


def api_error_response(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """``response`` itself, or, for an error (status >= 400) to an ``/api/`` path that is not
    JSON (Django's HTML 404/500 pages, the debug pages), a ``{"message", "extra": {}}`` JSON
    answer with the same status and its ``Retry-After``/``WWW-Authenticate``/``Allow``
    headers."""
    if response.status_code < 400 or not request.path.startswith(API_PATH_PREFIX) or _is_json(response):
        return response
    if response.status_code == status.HTTP_404_NOT_FOUND:
        message = "Not found."
    elif response.status_code >= 500:
        message = "Internal server error."
    else:
        message = response.reason_phrase or "Request refused."
        message = message if message.endswith(".") else message + "."
    shaped = JsonResponse({"message": message, "extra": {}}, status=response.status_code)
    for header in _KEPT_HEADERS:
        if header in response:
            shaped[header] = response[header]
    return shaped


class ApiErrorShapeMiddleware:
    """Every error answer under ``/api/`` in the ``{message, extra}`` shape, also those made
    outside DRF: no route (negative or non-numeric ids) → 404, a body over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` → 413 ``extra.max_bytes``, an unhandled exception → 500.
    Other paths (console, SPA) are left alone. Sync and async capable (no thread hop in ASGI).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return api_error_response(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        return api_error_response(request, await self.get_response(request))

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponseBase | None:
        """A view's ``RequestDataTooBig`` → JSON 413 (Django would answer an HTML 400); an
        exhausted database pool → JSON 503 with ``Retry-After`` (Django: a 500)."""
        if not request.path.startswith(API_PATH_PREFIX):
            return None
        if isinstance(exception, RequestDataTooBig):
            return JsonResponse(_too_big_body(), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        if _pool_exhausted(exception):
            busy = JsonResponse(_busy_body(), status=status.HTTP_503_SERVICE_UNAVAILABLE)
            busy["Retry-After"] = str(BUSY_RETRY_AFTER_SECONDS)
            return busy
        return None
