"""classify_error / classify_http_error: provider failures to error classes.

The table test runs every real error body in ``fixtures/error_bodies/*.json`` (one file per
provider, each case with the URL where the body was seen) through the SDKs' own
status-error builders, so the exceptions are exactly what ``openai`` / ``anthropic`` raise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llm.errors import (
    ERROR_CLASSES,
    RETRYABLE_CLASSES,
    AllEntriesFailed,
    ContextWindowExceeded,
    LLMError,
    ModelCallError,
    StreamInterrupted,
    classify_error,
    classify_finish_reason,
    classify_http_error,
    parse_retry_after,
    redact_secrets,
)

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

httpx2 = pytest.importorskip("httpx2")  # the openai 3.x SDK's transport

URL = "http://127.0.0.1:9/v1/chat/completions"
FIXTURES = Path(__file__).parent / "fixtures" / "error_bodies"
PROVIDER_FILES = ("openai", "deepseek", "zhipu", "vllm", "ollama", "llamacpp", "anthropic")


def _request() -> Any:
    return httpx2.Request("POST", URL)


def _response(status: int, body: Any, headers: dict[str, str] | None = None) -> Any:
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode() if body is not None else b""
    return httpx2.Response(status, headers=headers or {}, content=content, request=_request())


def _openai_error(status: int, body: Any, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    """What the openai SDK raises for this HTTP answer (its own builder, so ``body`` is unwrapped
    from ``{"error": ...}`` exactly as in production)."""
    client = openai.OpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    try:
        return client._make_status_error_from_response(_response(status, body, headers))
    finally:
        client.close()


def _anthropic_error(status: int, body: Any, headers: dict[str, str] | None = None) -> BaseException:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url="http://127.0.0.1:9")
    try:
        return client._make_status_error_from_response(_response(status, body, headers))
    finally:
        client.close()


def _load_cases() -> list[Any]:
    params = []
    for provider in PROVIDER_FILES:
        data = json.loads((FIXTURES / f"{provider}.json").read_text(encoding="utf-8"))
        for case in data["cases"]:
            params.append(pytest.param(provider, case, id=f"{provider}: {case['name']}"))
    return params


CASES = _load_cases()


# --- the fixture table ----------------------------------------------------------------------


def test_every_provider_has_a_fixture_file_with_sourced_cases() -> None:
    for provider in PROVIDER_FILES:
        data = json.loads((FIXTURES / f"{provider}.json").read_text(encoding="utf-8"))
        assert data["cases"], provider
        for case in data["cases"]:
            assert set(case) >= {"name", "status", "headers", "body", "expected_class", "source"}
            assert case["expected_class"] in ERROR_CLASSES
            assert case["source"].startswith("http"), f"{provider}/{case['name']}: cite where the body was seen"
    covered = {case.values[1]["expected_class"] for case in CASES}
    assert covered >= {
        "rate_limit", "quota_exhausted", "overloaded", "server", "context_window", "content_policy", "auth",
        "not_found", "bad_request",
    }


@pytest.mark.parametrize(("provider", "case"), CASES)
def test_fixture_through_the_openai_sdk(provider: str, case: dict[str, Any]) -> None:
    exc = _openai_error(case["status"], case["body"], case["headers"])

    err = classify_error(exc)

    assert err.error_class == case["expected_class"], err.message
    assert err.status_code == case["status"]
    assert err.message and len(err.message) <= 500
    if "expected_retry_after_seconds" in case:
        assert err.retry_after_seconds == pytest.approx(case["expected_retry_after_seconds"])


@pytest.mark.parametrize(("provider", "case"), CASES)
def test_fixture_through_the_pure_function(provider: str, case: dict[str, Any]) -> None:
    # The raw wire body (not unwrapped by an SDK), as an adapter without an SDK would pass it.
    err = classify_http_error(status_code=case["status"], body=case["body"], headers=httpx.Headers(case["headers"]))

    assert err.error_class == case["expected_class"]


@pytest.mark.parametrize(
    ("provider", "case"), [c for c in CASES if c.values[0] == "anthropic"]
)
def test_anthropic_fixture_through_the_anthropic_sdk(provider: str, case: dict[str, Any]) -> None:
    exc = _anthropic_error(case["status"], case["body"], case["headers"])

    assert classify_error(exc).error_class == case["expected_class"]


def test_finish_reasons_from_the_fixture() -> None:
    data = json.loads((FIXTURES / "openai.json").read_text(encoding="utf-8"))
    for case in data["finish_reasons"]:
        err = classify_finish_reason(case["finish_reason"])
        assert (err.error_class if err else None) == case["expected_class"], case
    refusal = classify_finish_reason("refusal")  # Anthropic's stop_reason for safety refusals
    assert refusal is not None and refusal.error_class == "content_policy"
    assert classify_finish_reason(None) is None


# --- status codes without a body ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (500, "server"),
        (502, "server"),
        (504, "server"),
        (503, "overloaded"),
        (529, "overloaded"),
        (429, "rate_limit"),
        (402, "quota_exhausted"),
        (400, "bad_request"),
        (422, "bad_request"),
        (413, "context_window"),
        (401, "auth"),
        (403, "auth"),
        (404, "not_found"),
        (408, "timeout"),
        (409, "other"),
    ],
)
def test_status_codes(status: int, expected: str) -> None:
    err = classify_error(_openai_error(status, {"error": {"message": f"HTTP {status}"}}))

    assert (err.error_class, err.status_code) == (expected, status)


def test_retryable_classes() -> None:
    assert RETRYABLE_CLASSES == {"rate_limit", "overloaded", "server", "timeout", "network"}
    assert RETRYABLE_CLASSES <= ERROR_CLASSES
    assert {"quota_exhausted", "overloaded", "content_policy"} <= ERROR_CLASSES


def test_a_token_rate_limit_is_not_a_context_window() -> None:
    # "too many tokens" in a 429 is about tokens per minute (Cerebras wording).
    body = {"error": {"message": "Tokens per minute limit exceeded - too many tokens processed."}}

    assert classify_error(_openai_error(429, body)).error_class == "rate_limit"


def test_a_bad_request_naming_a_missing_function_is_not_a_missing_model() -> None:
    body = {"error": {"message": "Tool 'lookup' does not exist in the request", "type": "invalid_request_error"}}

    assert classify_error(_openai_error(400, body)).error_class == "bad_request"


def test_non_json_bodies() -> None:
    assert classify_error(_openai_error(502, "<html>Bad Gateway</html>")).error_class == "server"
    assert classify_http_error(status_code=400, body="prompt is too long").error_class == "context_window"
    assert classify_http_error(status_code=503, body=None).error_class == "overloaded"


# --- retry-after -------------------------------------------------------------------------------


def test_rate_limit_reads_retry_after() -> None:
    err = classify_error(_openai_error(429, {"error": {"message": "slow"}}, {"Retry-After": "7"}))

    assert (err.error_class, err.retry_after_seconds) == ("rate_limit", 7.0)
    assert "slow" in err.message


def test_overloaded_and_server_read_retry_after_too() -> None:
    assert classify_error(_openai_error(503, None, {"retry-after": "2"})).retry_after_seconds == 2.0
    assert classify_error(_openai_error(500, None, {"retry-after-ms": "250"})).retry_after_seconds == 0.25
    assert classify_error(_openai_error(401, None, {"retry-after": "2"})).retry_after_seconds is None


def test_retry_after_ms_wins_and_dates_parse() -> None:
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert parse_retry_after(httpx.Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"}), now=1445412480.0) == 10.0
    assert parse_retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert parse_retry_after(httpx.Headers({"Retry-After": "-3"})) is None
    assert parse_retry_after(None) is None


# --- transport and in-stream errors ------------------------------------------------------------


def test_timeout_and_connection_errors() -> None:
    timeout = classify_error(openai.APITimeoutError(request=_request()))
    network = classify_error(openai.APIConnectionError(request=_request()))

    assert (timeout.error_class, timeout.status_code) == ("timeout", None)
    assert (network.error_class, network.status_code) == ("network", None)


def test_anthropic_transport_errors_by_class_name() -> None:
    anthropic = pytest.importorskip("anthropic")
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/messages")

    assert classify_error(anthropic.APITimeoutError(request=request)).error_class == "timeout"
    assert classify_error(anthropic.APIConnectionError(request=request)).error_class == "network"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"message": "server had an error", "type": "server_error"}, "server"),
        ({"message": "Rate limit reached", "type": "rate_limit_exceeded"}, "rate_limit"),
        ({"message": "too long", "code": "context_length_exceeded"}, "context_window"),
        ({"type": "overloaded_error", "message": "Overloaded"}, "overloaded"),  # Anthropic SSE error event
        ({"code": "server_is_overloaded", "message": "Our servers are currently overloaded."}, "overloaded"),
        ({"code": "1301", "message": "系统检测到输入或生成内容可能包含不安全或敏感内容"}, "content_policy"),
        ({"type": "insufficient_quota", "message": "You exceeded your current quota"}, "quota_exhausted"),
        ({"type": "authentication_error", "message": "invalid x-api-key"}, "auth"),
        ({"type": "invalid_request_error", "message": "messages: field required"}, "bad_request"),
        ({"message": "?"}, "other"),
    ],
)
def test_errors_inside_a_stream_classify_by_body(body: dict[str, Any], expected: str) -> None:
    err = classify_error(openai.APIError(body.get("message", "x"), _request(), body=body))

    assert (err.error_class, err.status_code) == (expected, None)


def test_an_error_event_in_a_200_stream_is_classified_by_body() -> None:
    # The anthropic SDK raises an SSE "error" event as a status error carrying the HTTP 200.
    err = classify_http_error(status_code=200, body={"type": "error", "error": {"type": "overloaded_error"}})

    assert (err.error_class, err.status_code) == ("overloaded", None)


def test_transport_and_builtin_errors() -> None:
    assert classify_error(TimeoutError()).error_class == "timeout"
    assert classify_error(httpx.ReadTimeout("slow")).error_class == "timeout"
    assert classify_error(httpx2.ConnectError("refused")).error_class == "network"
    assert classify_error(ConnectionResetError()).error_class == "network"
    assert classify_error(ValueError("bad json")).error_class == "other"


# --- the error types ---------------------------------------------------------------------------


def test_model_call_error_passes_through_and_validates() -> None:
    err = ModelCallError("server", "x", status_code=500)

    assert classify_error(err) is err
    assert err.falls_back and not ModelCallError("bad_request", "x").falls_back
    assert ModelCallError("content_policy", "x").falls_back and ModelCallError("quota_exhausted", "x").falls_back
    with pytest.raises(ValueError):
        ModelCallError("nope", "x")  # type: ignore[arg-type]


def test_hierarchy() -> None:
    cause = ModelCallError("network", "cut")
    interrupted = StreamInterrupted(cause, entry_index=1, provider_name="p", model="m")

    assert isinstance(interrupted, LLMError) and interrupted.retryable
    assert interrupted.error_class == "network" and interrupted.entry_index == 1
    assert issubclass(ModelCallError, LLMError) and issubclass(AllEntriesFailed, LLMError)
    assert AllEntriesFailed([]).attempts == []


def test_context_window_exceeded() -> None:
    err = ContextWindowExceeded(estimated_prompt_tokens=9000, largest_window_tokens=8192)

    assert isinstance(err, AllEntriesFailed) and isinstance(err, LLMError)
    assert (err.estimated_prompt_tokens, err.largest_window_tokens, err.attempts) == (9000, 8192, [])
    assert "9000" in str(err) and "8192" in str(err) and "compact" in str(err)


def test_long_messages_are_truncated() -> None:
    err = classify_error(_openai_error(500, {"error": {"message": "x" * 5000}}))

    assert len(err.message) <= 500


def test_stream_interrupted_from_a_message() -> None:
    err = StreamInterrupted("the stream ended without a completion")

    assert err.error_class == "other" and err.entry_index is None
    assert "ended without a completion" in str(err)


# --- facts read from the body (make mutation's llm-errors survivors, issue 35) -----------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"error": {"code": "1261", "message": "Request rejected"}}, "context_window"),  # Zhipu's code
        ({"error": {"code": 1301, "message": "Request rejected"}}, "content_policy"),  # a number
        # Azure's innererror.code, Anthropic's details.error_code: the text names no marker
        (
            {"error": {"message": "The response was filtered", "innererror": {"code": "ResponsibleAIPolicyViolation"}}},
            "content_policy",
        ),
        (
            {"error": {"message": "Request rejected", "details": {"error_code": "insufficient_balance"}}},
            "quota_exhausted",
        ),
    ],
)
def test_a_code_alone_classifies_a_body_whose_text_names_no_marker(body: dict[str, Any], expected: str) -> None:
    assert classify_http_error(status_code=400, body=body).error_class == expected


def test_the_human_message_is_the_bodys_message_before_its_detail() -> None:
    err = classify_http_error(status_code=400, body={"error": {"message": "Primary text", "detail": "secondary"}})
    assert err.message == "Primary text"


def test_a_body_in_bytes_is_decoded_even_when_not_utf8() -> None:
    err = classify_http_error(status_code=429, body=b'{"error": {"message": "Rate limit reached \xff"}}')
    assert (err.error_class, err.message) == ("rate_limit", "Rate limit reached \ufffd")


def test_known_secrets_and_their_fragments_are_redacted() -> None:
    key = "zq7Vx9kLmN3pQr2s"
    assert redact_secrets(f"bad credentials {key} at /v1", secrets=[key, "abc"]) == "bad credentials [redacted] at /v1"
    assert redact_secrets(f"cut: {key[:12]}", secrets=[key]) == "cut: [redacted]"
    assert redact_secrets("abc abcd", secrets=["abc"]) == "abc abcd"  # under 4 characters: ignored
    err = ModelCallError("auth", f"upstream echoed {key}").redact([key])
    assert (err.message, err.args) == ("upstream echoed [redacted]", ("upstream echoed [redacted]",))
