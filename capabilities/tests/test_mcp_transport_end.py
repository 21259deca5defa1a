"""The pool's own record of a transport's end (:mod:`capabilities.mcp.transport_end`): the
read stream of an SDK transport, watched, marks its end however the reader meets it."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
import pytest

from capabilities.mcp.transport_end import TransportEnd, watched

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


@asynccontextmanager
async def _memory_transport(items: list[str]):
    """A transport whose read stream yields ``items`` then ends (its sender closed)."""
    send, receive = anyio.create_memory_object_stream[str](len(items))
    out_send, out_receive = anyio.create_memory_object_stream[str](1)
    async with send:
        for item in items:
            await send.send(item)
    try:
        yield receive, out_send
    finally:
        out_receive.close()


async def test_iterating_to_the_end_marks_it_and_keeps_every_item() -> None:
    end = TransportEnd()
    async with watched(_memory_transport(["a", "b"]), end) as (read_stream, write_stream):
        async with read_stream:
            seen = []
            async for item in read_stream:
                assert not end.ended
                seen.append(item)
        await write_stream.aclose()
    assert seen == ["a", "b"] and end.ended


async def test_receive_past_the_end_marks_it() -> None:
    end = TransportEnd()
    async with watched(_memory_transport(["a"]), end) as (read_stream, _):
        assert await read_stream.receive() == "a" and not end.ended
        with pytest.raises(anyio.EndOfStream):
            await read_stream.receive()
    assert end.ended


async def test_a_stream_closed_under_the_reader_marks_it() -> None:
    end = TransportEnd()
    async with watched(_memory_transport(["a"]), end) as (read_stream, _):
        await read_stream.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await read_stream.__anext__()
    assert end.ended


async def test_an_open_stream_is_not_ended_and_its_sender_context_is_passed_on() -> None:
    end = TransportEnd()
    send, receive = anyio.create_memory_object_stream[str](1)

    @asynccontextmanager
    async def transport():
        yield receive, send

    async with watched(transport(), end) as (read_stream, _):
        await send.send("x")
        assert await read_stream.receive() == "x"
        assert read_stream.last_context is None  # a plain memory stream keeps none
    assert not end.ended
    send.close()
    receive.close()
