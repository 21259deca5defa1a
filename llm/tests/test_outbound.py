"""Provider base URLs follow the outbound address rules (issue 23, M7).

The attack: a tenant admin pointed a provider at ``http://127.0.0.1:8000/…`` (the platform
itself), ``:6379`` (Redis) and ``:5432`` (PostgreSQL); the route test reflected 500
characters of the answer. Now such a URL is refused when saved, and every connect (chat on
either HTTP transport, the route test, redirects, a name that re-resolves to loopback) is
checked again, unless an operator allowed the host (``OUTBOUND_ALLOWED_HOSTS``/``_CIDRS``).
The test settings allow 127.0.0.0/8 for the fake servers; these tests take that away.
"""

from __future__ import annotations

import pytest

from agents.tests.factories import agent_with_route
from llm import netrules
from llm.errors import AllEntriesFailed
from llm.models import ModelProvider
from llm.providers import anthropic as anthropic_adapter
from llm.providers import openai_compat
from llm.router import Router
from llm.testing import FakeLLMServer, Reply, fake_dns
from llm.tests.test_router import collect, entry, text_of

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


@pytest.fixture
def no_internal_hosts(settings):
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = []


@pytest.fixture(params=["aiohttp", "httpx"])
async def transport(request, settings):
    settings.LLM_HTTP_TRANSPORT = request.param
    await openai_compat.aclose_clients()
    yield request.param
    await openai_compat.aclose_clients()


async def test_a_provider_on_loopback_is_refused_at_connect(no_internal_hosts, transport, server_a: FakeLLMServer):
    server_a.script(Reply("secret answer of an internal service"))
    with pytest.raises(AllEntriesFailed) as caught:
        await collect(Router([entry(0, server_a.base_url)]))
    assert caught.value.last_error.error_class == "network"
    assert "loopback" in caught.value.last_error.message
    assert server_a.requests == [] and server_a.connections_accepted == 0


async def test_a_provider_name_that_rebinds_to_loopback_is_refused(no_internal_hosts, transport, monkeypatch,
                                                                   server_a: FakeLLMServer):
    async def rebinding(host, port):
        return [(2, 1, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(netrules, "_getaddrinfo", rebinding)
    with pytest.raises(AllEntriesFailed) as caught:
        await collect(Router([entry(0, f"http://llm.example.com:{server_a.port}/v1")]))
    assert "resolves to 127.0.0.1" in caught.value.last_error.message
    assert server_a.connections_accepted == 0


async def test_an_anthropic_provider_on_loopback_is_refused(no_internal_hosts, server_a: FakeLLMServer):
    with pytest.raises(AllEntriesFailed) as caught:
        await collect(Router([entry(0, server_a.base_url, api="anthropic")]))
    assert "loopback" in caught.value.last_error.message
    assert server_a.connections_accepted == 0
    await anthropic_adapter.aclose_clients()


async def test_an_operator_allowed_host_port_is_reached(settings, transport, server_a: FakeLLMServer):
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = [f"127.0.0.1:{server_a.port}"]
    server_a.script(Reply("hello"))
    assert text_of(await collect(Router([entry(0, server_a.base_url)]))) == "hello"


def test_the_default_allows_the_embedded_models_hosts_only(monkeypatch):
    import os

    from agent_platform import settings as base

    monkeypatch.setattr(base, "LLM_BASE_URL", "http://127.0.0.1:8081/v1")
    monkeypatch.setattr(base, "LLM_LARGE_BASE_URL", "http://127.0.0.1:8083/v1")
    monkeypatch.setattr(base, "EMBEDDINGS_BASE_URL", "http://127.0.0.1:8082/v1")
    # The embedded chat models and the embedded embedder.
    assert base._default_outbound_hosts() == "127.0.0.1:8081,127.0.0.1:8083,127.0.0.1:8082"  # noqa: SLF001
    monkeypatch.setattr(base, "LLM_LARGE_BASE_URL", "")  # no larger model: nothing added for it
    assert base._default_outbound_hosts() == "127.0.0.1:8081,127.0.0.1:8082"  # noqa: SLF001
    monkeypatch.setattr(base, "LLM_BASE_URL", "https://[::1]/v1")
    monkeypatch.setattr(base, "LLM_LARGE_BASE_URL", "https://[::1]/v1")
    monkeypatch.setattr(base, "EMBEDDINGS_BASE_URL", "https://[::1]:443/v1")
    assert base._default_outbound_hosts() == "[::1]:443"  # noqa: SLF001 - listed once
    if "OUTBOUND_ALLOWED_CIDRS" not in os.environ:
        assert base.OUTBOUND_ALLOWED_CIDRS == []


# --- at save time, through the admin API and the route test -----------------------------------

INTERNAL_URLS = [
    "http://127.0.0.1:8000/v1", "http://127.0.0.1:6379", "http://localhost:5432/v1", "http://[::1]:8000/v1",
    "http://169.254.169.254/latest", "http://10.0.0.5/v1", "http://0.0.0.0:8000/v1", "http://[::ffff:127.0.0.1]/v1",
]


@pytest.mark.django_db
@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_the_admin_api_refuses_an_internal_provider_url(world, no_internal_hosts, url):
    resp = world.client(admin=True).post("/api/v1/admin/providers/", {"name": "evil", "base_url": url}, format="json")
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert set(body) == {"message", "extra"} and "base_url" in str(body)
    assert not ModelProvider.all_tenants.filter(name="evil").exists()


@pytest.mark.django_db
def test_the_admin_api_accepts_a_public_provider_url(world, no_internal_hosts, monkeypatch):
    fake_dns(monkeypatch, {"api.openai.com": "203.0.113.10"})
    monkeypatch.setattr(netrules, "address_block_reason", lambda ip, allowed=None: None)
    resp = world.client(admin=True).post("/api/v1/admin/providers/",
                                         {"name": "openai", "base_url": "https://api.openai.com/v1"}, format="json")
    assert resp.status_code == 201, resp.content


@pytest.mark.django_db(transaction=True)
def test_the_route_test_does_not_reach_or_reflect_an_internal_service(world, no_internal_hosts, fake_llm):
    route = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url]).route  # saved before the rule
    fake_llm.script(Reply("INTERNAL-" * 100))
    resp = world.client(admin=True).post(f"/api/v1/admin/routes/{route.pk}/test/")
    assert resp.status_code == 200
    [result] = resp.json()
    assert result["ok"] is False and result["error_class"] == "network"
    assert "INTERNAL" not in str(result) and "loopback" in result["error"]
    assert fake_llm.connections_accepted == 0
