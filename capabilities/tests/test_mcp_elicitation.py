"""Our MCP client and elicitation (capabilities.mcp.elicitation), without a database: a
2026-07-28 server's ``InputRequiredResult`` becomes an :class:`InputForUser` and the call made
again with the answer completes; ``-32042`` becomes a URL request; a 2025-11-25 server's
``elicitation/create`` inside the call is declined at once; form content is checked against
the requested schema."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.mcp.elicitation import content_errors, resume_arguments
from capabilities.tests.elicit_test_server import SIGN_IN_URL, serve_travel
from capabilities.tools import InputForUser

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture
def travel_url() -> Iterator[str]:
    with serve_travel() as url:
        yield url


def config(url: str, mode: str = "auto") -> McpServerConfig:
    return McpServerConfig(alias="travel", transport="streamable_http", url=url, connect_timeout_seconds=10.0,
                           protocol_mode=mode)  # type: ignore[arg-type]


async def test_input_required_is_asked_then_answered_by_a_second_call(travel_url: str) -> None:
    async with McpConnection(config(travel_url)) as conn:
        with pytest.raises(InputForUser) as asked:
            await conn.call_tool_raw("book", {}, timeout_seconds=10)
        request = asked.value.request
        assert (request["mode"], request["message"], request["server"], request["protocol"]) == (
            "form", "Where to, and for how long?", "travel", "input_required")
        assert request["schema"]["required"] == ["city"] and request["request_state"]
        answer = {"request": request, "action": "accept", "content": {"city": "Oslo", "days": 2}}
        result = await conn.call_tool_raw("book", {}, timeout_seconds=10, resume=resume_arguments(answer))
    assert result.content[0].text == "booked Oslo for 2 days"


async def test_url_elicitation_required_becomes_a_url_request(travel_url: str) -> None:
    async with McpConnection(config(travel_url)) as conn:
        with pytest.raises(InputForUser) as asked:
            await conn.call_tool_raw("connect", {}, timeout_seconds=10)
        assert (asked.value.request["mode"], asked.value.request["url"]) == ("url", SIGN_IN_URL)
        assert (await conn.call_tool_raw("connect", {}, timeout_seconds=10)).content[0].text == "connected"


async def test_a_legacy_request_inside_the_call_is_declined_at_once(travel_url: str) -> None:
    async with McpConnection(config(travel_url, "legacy")) as conn:
        result = await conn.call_tool_raw("book", {}, timeout_seconds=10)
    assert result.content[0].text == "not booked: decline"


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 5},
        "email": {"type": "string", "format": "email"},
        "when": {"type": "string", "format": "date"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "ok": {"type": "boolean"},
        "size": {"type": "string", "enum": ["S", "M"]},
        "tier": {"type": "string", "oneOf": [{"const": "free", "title": "Free"}, {"const": "pro", "title": "Pro"}]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 1},
    },
    "required": ["name"],
}


def test_content_is_checked_against_the_spec_primitive_types() -> None:
    good = {"name": "Ann", "email": "a@b.io", "when": "2026-12-02", "age": 40, "ok": True, "size": "M",
            "tier": "pro", "tags": ["a"]}
    assert content_errors(SCHEMA, good) == {}
    bad = {"email": "nope", "when": "tomorrow", "age": 1.5, "ok": "yes", "size": "XL", "tier": "gold",
           "tags": ["a", "b"], "extra": 1}
    assert set(content_errors(SCHEMA, bad)) == {"name", "email", "when", "age", "ok", "size", "tier", "tags", "extra"}
    assert content_errors(SCHEMA, {"name": "A"}) == {"name": "name: at least 2 characters"}
    assert content_errors(SCHEMA, []) == {"content": "content: must be an object of the form's fields"}
