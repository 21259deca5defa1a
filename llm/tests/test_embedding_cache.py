"""What llm.embeddings keeps between calls: a provider's resolved endpoint (decrypted key) until
the provider changes, and the SDK client with its keep-alive connection, per event loop and
outbound rule set. Against a scripted HTTP/1.1 server on 127.0.0.1 that records each request's
key and client port."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llm import embeddings
from llm.embeddings import ENDPOINT_CACHE_SIZE, EmbeddingEndpoint, EmbeddingError, aembed_texts, embed_texts

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


class _Server:
    """Answers POST …/embeddings with one 2-d vector per input, keeping connections alive
    (HTTP/1.1); records ``(authorization, client port)`` per request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append((self.headers.get("Authorization", ""), self.client_address[1]))
                data = json.dumps({"object": "list", "model": body["model"], "data": [
                    {"object": "embedding", "index": i, "embedding": [3.0, 4.0]}
                    for i in range(len(body["input"]))]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Callable[[], _Server]]:
    started: list[_Server] = []

    def start() -> _Server:
        started.append(_Server())
        return started[-1]

    yield start
    for s in started:
        s.close()


def _fresh(provider):
    """The provider as a new query returns it (no tenant cached on the instance)."""
    from llm.models import ModelProvider

    return ModelProvider.all_tenants.get(pk=provider.pk)


@pytest.mark.django_db
def test_an_unchanged_provider_is_resolved_once_and_a_changed_key_or_url_afresh(tenant, server,
                                                                                 django_assert_num_queries):
    from llm.services import provider_save

    first, second = server(), server()
    provider = provider_save(tenant=tenant, name="hosted", base_url=first.base_url, api_key="sk-first-0123456789")
    assert embed_texts(_fresh(provider), "m", ["a"]) == [[0.6, 0.8]]  # resolved: reads the tenant, decrypts
    again = _fresh(provider)
    with django_assert_num_queries(0):  # the tenant is not read again: the endpoint is kept
        embed_texts(again, "m", ["b"])
    assert [auth for auth, _ in first.seen] == ["Bearer sk-first-0123456789"] * 2

    provider = provider_save(tenant=tenant, provider=provider, api_key="sk-second-0123456789")
    embed_texts(_fresh(provider), "m", ["c"])
    assert first.seen[-1][0] == "Bearer sk-second-0123456789"  # the new key, not the kept one

    provider = provider_save(tenant=tenant, provider=provider, base_url=second.base_url)
    embed_texts(_fresh(provider), "m", ["d"])
    assert len(first.seen) == 3 and [auth for auth, _ in second.seen] == ["Bearer sk-second-0123456789"]


@pytest.mark.django_db(transaction=True)
async def test_the_async_variant_uses_the_kept_endpoint(tenant, server):
    from channels.db import database_sync_to_async

    from llm.services import provider_save

    s = server()
    provider = await database_sync_to_async(provider_save)(tenant=tenant, name="hosted", base_url=s.base_url,
                                                           api_key="sk-async-0123456789")
    await aembed_texts(provider, "m", ["a"])
    provider = await database_sync_to_async(provider_save)(tenant=tenant, provider=provider,
                                                           api_key="sk-async-changed-0123456789")
    await aembed_texts(provider, "m", ["b"])
    assert [auth for auth, _ in s.seen] == ["Bearer sk-async-0123456789", "Bearer sk-async-changed-0123456789"]
    await aembed_texts(provider, "m", ["c"])
    await aembed_texts(provider, "m", ["d"])
    assert s.seen[-1][1] == s.seen[-2][1]  # the same kept connection, from this test's own event loop


def test_sync_calls_reuse_one_kept_connection(server):
    s = server()
    endpoint = EmbeddingEndpoint(name="s", base_url=s.base_url)
    for text in ("a", "b", "c"):
        embed_texts(endpoint, "m", [text])
    ports = {port for _, port in s.seen}
    assert len(s.seen) == 3 and len(ports) == 1, s.seen  # one TCP connection for the three calls


def test_a_connection_kept_under_other_outbound_rules_is_not_reused(settings, server):
    s = server()
    endpoint = EmbeddingEndpoint(name="s", base_url=s.base_url)
    embed_texts(endpoint, "m", ["a"])  # a connection to 127.0.0.1 is now kept alive
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = []
    with pytest.raises(EmbeddingError) as caught:
        embed_texts(endpoint, "m", ["b"])
    assert caught.value.error_class == "network" and "Refused" in caught.value.message
    assert len(s.seen) == 1


@pytest.mark.django_db
def test_the_endpoint_cache_is_bounded(tenant):
    from llm.services import provider_save

    providers = [provider_save(tenant=tenant, name=f"p{i}", base_url=f"https://embed{i}.example.com/v1")
                 for i in range(ENDPOINT_CACHE_SIZE + 3)]
    for provider in providers:
        embeddings.embedding_endpoint(provider)
    assert len(embeddings._endpoints) == ENDPOINT_CACHE_SIZE
    assert embeddings._cached_endpoint(providers[0]) is None  # the least recently used went first
    assert embeddings._cached_endpoint(providers[-1]).base_url == f"https://embed{ENDPOINT_CACHE_SIZE + 2}.example.com/v1"
