"""The adapter's stream pools on either transport (LLM_HTTP_TRANSPORT): aiohttp (the default)
and httpx behave the same, and failures are classified the same."""

from __future__ import annotations

import pytest

from llm.errors import AllEntriesFailed, StreamInterrupted
from llm.providers import openai_compat
from llm.router import Router
from llm.testing import CutAfter, FakeLLMServer, Reply, Stall
from llm.tests.test_router import Recorder, collect, entry, text_of

pytestmark = [pytest.mark.parametrize("transport", ["aiohttp", "httpx"]), pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture(autouse=True)
async def on_transport(settings, transport):
    settings.LLM_HTTP_TRANSPORT = transport
    await openai_compat.aclose_clients()  # pools are made on first use: the next ones use it
    yield
    await openai_compat.aclose_clients()


@pytest.fixture
def refused_url(closed_port_root: str) -> str:
    return closed_port_root + "/v1"


def _transport_of(shard: openai_compat._HttpShard) -> str:  # noqa: SLF001
    return "aiohttp" if "Aiohttp" in type(shard.http._transport).__name__ else "httpx"  # noqa: SLF001


async def test_an_answer_streams(server_a: FakeLLMServer, transport: str) -> None:
    server_a.script(Reply("It is ten past ten in Tokyo.", chunk_size=5))
    events = await collect(Router([entry(0, server_a.base_url)]))
    assert text_of(events) == "It is ten past ten in Tokyo."
    assert _transport_of(openai_compat._shard_for(entry(0, server_a.base_url))) == transport  # noqa: SLF001


async def test_a_refused_connection_is_a_network_failure(refused_url: str, transport: str) -> None:
    recorder = Recorder()
    with pytest.raises(AllEntriesFailed):
        await collect(Router([entry(0, refused_url, max_retries=0)], record=recorder))
    assert recorder.summary() == [(1, 0, "failed", "network")]


async def test_a_dropped_stream_is_a_network_failure(server_a: FakeLLMServer, transport: str) -> None:
    server_a.script(CutAfter("Partial answer that never ends", n_chunks=3, chunk_size=4))
    with pytest.raises(StreamInterrupted) as caught:
        await collect(Router([entry(0, server_a.base_url)]))
    assert caught.value.error_class == "network"


async def test_a_stalled_stream_is_a_timeout(server_a: FakeLLMServer, transport: str) -> None:
    server_a.script(Stall(Reply("Starts, then nothing more"), n_chunks=1))
    with pytest.raises(StreamInterrupted) as caught:
        await collect(Router([entry(0, server_a.base_url, read_timeout_seconds=0.5)]))
    assert caught.value.error_class == "timeout"


async def test_aiohttp_bodies_are_read_from_aiohttp_directly(server_a: FakeLLMServer, transport: str, monkeypatch) -> None:
    """On the aiohttp transport the SSE parser reads aiohttp's buffer itself, below httpx2's
    stream layers (bench/README.md, session 10). If an SDK release changes how its transport
    wraps aiohttp's response, this fails instead of streams silently taking the slower path."""
    bodies: list[object] = []
    recognise = openai_compat._aiohttp_body  # noqa: SLF001

    def spy(response):
        body = recognise(response)
        bodies.append(body)
        return body

    monkeypatch.setattr(openai_compat, "_aiohttp_body", spy)
    server_a.script(Reply("Read straight from the socket buffer.", chunk_size=4))
    events = await collect(Router([entry(0, server_a.base_url)]))
    assert text_of(events) == "Read straight from the socket buffer."
    assert len(bodies) == 1
    assert (bodies[0] is not None) == (transport == "aiohttp")


async def test_a_content_encoded_aiohttp_body_takes_httpx2s_decoder(transport: str) -> None:
    """A compressed body must go through httpx2's decoder: only identity bodies are read raw."""
    import httpx2

    from llm.providers.aiohttp_transport import READER_EXTENSION

    class Raw:
        content = object()

    def response(headers: dict[str, str]) -> httpx2.Response:  # as AiohttpTransport makes them
        return httpx2.Response(200, headers=headers, request=httpx2.Request("POST", "http://x/v1"),
                               extensions={READER_EXTENSION: Raw.content})

    assert openai_compat._aiohttp_body(response({"content-encoding": "gzip"})) is None  # noqa: SLF001
    assert openai_compat._aiohttp_body(response({})) is Raw.content  # noqa: SLF001
    assert openai_compat._aiohttp_body(response({"content-encoding": "identity"})) is Raw.content  # noqa: SLF001
