"""The OpenAI-compatible adapter's server-sent events decoding (``_SseDecoder``, ``_sse_payloads``):
the SSE rules the SDK's decoder follows, events split across reads, ``[DONE]``, and the
in-stream ``{"error": …}`` object and a payload that is not JSON, each after what came before
it in the same read."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from llm.providers.openai_compat import _BadEvent, _sse_payloads, _SseDecoder

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _event(payload: object, *, eol: bytes = b"\n") -> bytes:
    return b"data: " + json.dumps(payload).encode() + eol + eol


class _Stream(httpx2.AsyncByteStream):
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def __aiter__(self):
        for read in self.reads:
            yield read


async def _lists(reads: list[bytes]) -> list[list[object]]:
    response = httpx2.Response(200, stream=_Stream(reads), request=httpx2.Request("POST", "http://x/v1"))
    return [payloads async for payloads in _sse_payloads(response)]


def test_crlf_lines_comments_other_fields_and_multiline_data() -> None:
    decoder = _SseDecoder()
    body = (b": keep-alive\r\n\r\n"  # a comment, then a blank line without data: no event
            b"event: message\r\nid: 7\r\nretry: 100\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n"
            b"data:{\"b\": 2}\n\n")
    assert decoder.feed(body) == [{"a": 1}, {"b": 2}]  # data lines joined by a newline; "data:" without space
    assert not decoder.done


def test_an_event_split_anywhere_across_reads_and_the_end_of_the_body() -> None:
    body = _event({"n": 1}, eol=b"\r\n") + _event({"n": 2})
    for cut in range(1, len(body)):
        decoder = _SseDecoder()
        got = decoder.feed(body[:cut]) + decoder.feed(body[cut:])
        assert got == [{"n": 1}, {"n": 2}], cut
    decoder = _SseDecoder()
    assert decoder.feed(b'data: {"last": true}') == []
    assert decoder.feed(b"") == [{"last": True}]  # the end of the body ends its last line and its event


def test_done_stops_the_decoding() -> None:
    decoder = _SseDecoder()
    assert decoder.feed(_event({"n": 1}) + b"data: [DONE]\n\n" + _event({"n": 2})) == [{"n": 1}]
    assert decoder.done


def test_an_error_object_and_a_payload_that_is_not_json_carry_what_came_before() -> None:
    with pytest.raises(_BadEvent) as bad:
        _SseDecoder().feed(_event({"n": 1}) + _event({"error": {"message": "overloaded"}}))
    assert bad.value.ready == [{"n": 1}] and bad.value.payload == {"error": {"message": "overloaded"}}
    with pytest.raises(_BadEvent) as bad:
        _SseDecoder().feed(_event({"n": 1}) + b"data: {not json\n\n")
    assert bad.value.ready == [{"n": 1}] and isinstance(bad.value.error(None), ValueError)


async def test_the_stream_yields_what_came_first_then_raises_the_sdks_in_stream_error() -> None:
    reads = [_event({"n": 1}), _event({"n": 2}) + _event({"error": {"message": "model overloaded"}})]
    response = httpx2.Response(200, stream=_Stream(reads), request=httpx2.Request("POST", "http://x/v1"))
    got = []
    with pytest.raises(openai.APIError) as raised:
        async for payloads in _sse_payloads(response):
            got.append(payloads)
    assert got == [[{"n": 1}], [{"n": 2}]]
    assert raised.value.message == "model overloaded" and raised.value.body == {"message": "model overloaded"}
    with pytest.raises(openai.APIError) as raised:
        await _lists([_event({"error": "rate limited"})])
    assert raised.value.message == "An error occurred during streaming"


async def test_a_payload_that_is_not_json_is_a_value_error_after_the_good_ones() -> None:
    got = []
    response = httpx2.Response(200, stream=_Stream([_event({"n": 1}) + b"data: {oops\n\n"]),
                               request=httpx2.Request("POST", "http://x/v1"))
    with pytest.raises(ValueError):
        async for payloads in _sse_payloads(response):
            got.append(payloads)
    assert got == [[{"n": 1}]]


async def test_done_ends_the_stream_and_the_end_of_the_body_too() -> None:
    assert await _lists([_event({"n": 1}), b"data: [DONE]\n\n", _event({"n": 2})]) == [[{"n": 1}]]
    assert await _lists([_event({"n": 1}), _event({"n": 2})]) == [[{"n": 1}], [{"n": 2}]]
