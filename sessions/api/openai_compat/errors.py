"""OpenAI's error shape for every answer under ``/api/openai/v1``.

``{"error": {"message": str, "type": str, "code": str | None, "param": str | None}}``, as the
OpenAI API documents it (and the ``openai`` SDK turns into ``BadRequestError``,
``AuthenticationError``, ``NotFoundError``, ``ConflictError``, ``RateLimitError``, ...).
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse


class OpenAIError(Exception):
    """An error to answer in OpenAI's shape.

    Args:
        status: The HTTP status (400, 401, 404, 409, 429, ...).
        message: For the caller: what is wrong and what to do.
        type: OpenAI's error type (``invalid_request_error``, ``authentication_error``,
            ``rate_limit_error``, ``server_error``).
        code: A short machine-readable code (``model_not_found``, ``unsupported_parameter``...).
        param: The request field at fault (``messages[2].content``), if one is.
        retry_after: Seconds, sent as ``Retry-After`` (429).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        """The JSON body (also the ``error`` object of a stream's last chunk)."""
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def response(self) -> JsonResponse:
        """The JSON answer, with ``Retry-After`` when set."""
        response = JsonResponse(self.body(), status=self.status)
        if self.retry_after is not None:
            response["Retry-After"] = str(self.retry_after)
        return response


def bad_request(message: str, *, param: str | None = None, code: str | None = "invalid_request") -> OpenAIError:
    """A 400 ``invalid_request_error``."""
    return OpenAIError(400, message, param=param, code=code)
