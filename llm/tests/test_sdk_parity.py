"""What the model layer rebuilt from public APIs stays equal to the SDK's private original,
so an SDK release that changes it fails here instead of changing error classification."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from llm.errors import classify_error
from llm.providers.openai_compat import status_error_from_response

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

BODIES = [
    json.dumps({"error": {"message": "This model's maximum context length is 4096 tokens",
                          "code": "context_length_exceeded", "type": "invalid_request_error"}}),
    json.dumps({"error": {"message": "", "code": "x"}}),
    json.dumps({"message": "top-level message"}),
    json.dumps(["not", "a", "mapping"]),
    "plain text error page",
    "",
]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 429, 500, 502, 503, 529])
@pytest.mark.parametrize("body", BODIES)
async def test_status_errors_match_the_sdk(status: int, body: str) -> None:
    client = openai.AsyncOpenAI(api_key="k", base_url="http://x/v1", max_retries=0)
    request = httpx2.Request("POST", "http://x/v1/chat/completions")

    def response() -> httpx2.Response:
        made = httpx2.Response(status, content=body.encode(), request=request)
        made.read()
        return made

    ours = status_error_from_response(response())
    sdk = client._make_status_error_from_response(response())  # noqa: SLF001 - the reference

    assert type(ours) is type(sdk)
    assert str(ours) == str(sdk) and ours.body == sdk.body and ours.status_code == sdk.status_code
    assert classify_error(ours).error_class == classify_error(sdk).error_class
    await client.close()
