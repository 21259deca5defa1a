"""classify_error: OpenAI-SDK and transport exceptions to ModelCallError."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from llm.errors import (
    AllEntriesFailed,
    LLMError,
    ModelCallError,
    StreamInterrupted,
    classify_error,
    parse_retry_after,
)

httpx2 = pytest.importorskip("httpx2")  # the openai 3.x SDK's transport

URL = "http://127.0.0.1:9/v1/chat/completions"


def _request() -> Any:
    return httpx2.Request("POST", URL)


def _status_error(status: int, body: Any = None, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(
        status, headers=headers or {}, content=json.dumps(body).encode() if body is not None else b"", request=_request()
    )
    classes = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    cls = classes.get(status, openai.InternalServerError if status >= 500 else openai.APIStatusError)
    message = (body or {}).get("error", {}).get("message", f"HTTP {status}") if isinstance(body, dict) else "x"
    return cls(message, response=response, body=(body or {}).get("error") if isinstance(body, dict) else body)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (500, {"error": {"message": "boom"}}, "server"),
        (502, None, "server"),
        (503, {"error": {"message": "overloaded"}}, "server"),
        (429, {"error": {"message": "slow down"}}, "rate_limit"),
        (400, {"error": {"message": "bad 'messages'"}}, "bad_request"),
        (422, {"error": {"message": "unprocessable"}}, "bad_request"),
        (
            400,
            {"error": {"message": "This model's maximum context length is 8192 tokens", "code": "context_length_exceeded"}},
            "context_window",
        ),
        (413, None, "context_window"),
        (401, {"error": {"message": "bad key"}}, "auth"),
        (403, {"error": {"message": "forbidden"}}, "auth"),
        (404, {"error": {"message": "no such model"}}, "not_found"),
        (408, None, "timeout"),
        (409, None, "other"),
    ],
)
def test_status_codes(status: int, body: Any, expected: str) -> None:
    err = classify_error(_status_error(status, body))

    assert err.error_class == expected
    assert err.status_code == status


def test_rate_limit_reads_retry_after() -> None:
    err = classify_error(_status_error(429, {"error": {"message": "slow"}}, {"Retry-After": "7"}))

    assert (err.error_class, err.retry_after_seconds) == ("rate_limit", 7.0)
    assert "slow" in err.message


def test_retry_after_ms_wins_and_dates_parse() -> None:
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert parse_retry_after(httpx.Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"}), now=1445412480.0) == 10.0
    assert parse_retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert parse_retry_after(None) is None


def test_timeout_and_connection_errors() -> None:
    timeout = classify_error(openai.APITimeoutError(request=_request()))
    network = classify_error(openai.APIConnectionError(request=_request()))

    assert (timeout.error_class, timeout.status_code) == ("timeout", None)
    assert (network.error_class, network.status_code) == ("network", None)


def test_errors_inside_a_stream_classify_by_body() -> None:
    def in_stream(body: dict[str, Any]) -> ModelCallError:
        return classify_error(openai.APIError(body.get("message", "x"), _request(), body=body))

    assert in_stream({"message": "server had an error", "type": "server_error"}).error_class == "server"
    assert in_stream({"message": "Rate limit reached", "type": "rate_limit_exceeded"}).error_class == "rate_limit"
    assert in_stream({"message": "too long", "code": "context_length_exceeded"}).error_class == "context_window"
    assert in_stream({"message": "?"}).error_class == "other"


def test_transport_and_builtin_errors() -> None:
    assert classify_error(TimeoutError()).error_class == "timeout"
    assert classify_error(httpx.ReadTimeout("slow")).error_class == "timeout"
    assert classify_error(httpx2.ConnectError("refused")).error_class == "network"
    assert classify_error(ConnectionResetError()).error_class == "network"
    assert classify_error(ValueError("bad json")).error_class == "other"


def test_model_call_error_passes_through_and_validates() -> None:
    err = ModelCallError("server", "x", status_code=500)

    assert classify_error(err) is err
    assert err.falls_back and not ModelCallError("bad_request", "x").falls_back
    with pytest.raises(ValueError):
        ModelCallError("nope", "x")  # type: ignore[arg-type]


def test_hierarchy() -> None:
    cause = ModelCallError("network", "cut")
    interrupted = StreamInterrupted(cause, entry_index=1, provider_name="p", model="m")

    assert isinstance(interrupted, LLMError) and interrupted.retryable
    assert interrupted.error_class == "network" and interrupted.entry_index == 1
    assert issubclass(ModelCallError, LLMError) and issubclass(AllEntriesFailed, LLMError)
    assert AllEntriesFailed([]).attempts == []


def test_long_messages_are_truncated() -> None:
    err = classify_error(_status_error(500, {"error": {"message": "x" * 5000}}))

    assert len(err.message) <= 500


def test_stream_interrupted_from_a_message() -> None:
    err = StreamInterrupted("the stream ended without a completion")

    assert err.error_class == "other" and err.entry_index is None
    assert "ended without a completion" in str(err)
