"""The outbound address rules (capabilities/netsafe.py) for connections the platform makes on a
tenant's behalf: provider base URLs and remote MCP server URLs (issue 23, M7).

The test settings allow 127.0.0.0/8 for the suite's own servers; these tests set the
production defaults (no internal network) unless they say otherwise.
"""

from __future__ import annotations

import ipaddress

import pytest
from django.core.exceptions import ValidationError

from capabilities.netsafe import FetchError, check_outbound_url, outbound_host_allowed, resolve_outbound
from llm import netrules  # the DNS seam (_getaddrinfo) lives with the address rules
from llm.testing import fake_dns

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


@pytest.fixture(autouse=True)
def production_rules(settings):
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1:8081"]


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/", "http://127.0.0.1:6379", "http://127.0.0.1:5432", "http://localhost:8000/",
    "http://app.localhost/", "http://[::1]/", "http://0.0.0.0/", "http://10.1.2.3/", "http://192.168.0.1/",
    "http://172.16.0.1/", "http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/",
    "http://100.64.0.1/", "http://[fd00::1]/", "http://[::ffff:127.0.0.1]/", "http://127.0.0.1:8082/",
])
def test_internal_urls_are_refused_at_save(url):
    with pytest.raises(FetchError) as caught:
        check_outbound_url(url)
    assert caught.value.code == "blocked_address"


def test_a_name_resolving_to_loopback_is_refused_at_save(monkeypatch):
    fake_dns(monkeypatch, {"internal.example.com": "127.0.0.1"})
    with pytest.raises(FetchError, match="resolves to 127.0.0.1"):
        check_outbound_url("http://internal.example.com/v1")


def test_public_and_operator_allowed_urls_pass(monkeypatch):
    fake_dns(monkeypatch, {"api.example.com": "93.184.215.14"})
    check_outbound_url("https://api.example.com/v1")
    check_outbound_url("http://127.0.0.1:8081/v1")  # the embedded model (OUTBOUND_ALLOWED_HOSTS)


def test_an_unresolvable_name_passes_at_save_and_is_checked_at_connect(monkeypatch):
    fake_dns(monkeypatch, {"later.example.com": netrules.socket.gaierror(-2, "Name or service not known")})
    check_outbound_url("https://later.example.com/v1")


def test_allowed_cidrs_open_a_network_but_never_metadata(settings):
    settings.OUTBOUND_ALLOWED_CIDRS = ["10.0.0.0/8", "169.254.0.0/16"]
    check_outbound_url("http://10.1.2.3/v1")
    with pytest.raises(FetchError, match="metadata"):
        check_outbound_url("http://169.254.169.254/")


def test_allowed_hosts_match_host_and_port_exactly(settings):
    settings.OUTBOUND_ALLOWED_HOSTS = ["llm.internal:8000", "[::1]:9000", "127.0.0.1:8081"]
    assert outbound_host_allowed("llm.internal", 8000)
    assert outbound_host_allowed("LLM.internal.", 8000)
    assert not outbound_host_allowed("llm.internal", 8001)
    assert outbound_host_allowed("::1", 9000) and outbound_host_allowed("[::1]", 9000)
    assert not outbound_host_allowed("127.0.0.1", 6379)


async def test_resolve_outbound_checks_every_address(monkeypatch):
    async def mixed(host, port):
        return [(2, 1, 6, "", ("93.184.215.14", port)), (2, 1, 6, "", ("10.0.0.1", port))]

    monkeypatch.setattr(netrules, "_getaddrinfo", mixed)
    with pytest.raises(FetchError, match="private"):
        await resolve_outbound("mixed.example.com", 443)


async def test_resolve_outbound_lets_an_allowed_host_resolve_privately_but_not_to_metadata(settings, monkeypatch):
    settings.OUTBOUND_ALLOWED_HOSTS = ["llm.internal:8000"]
    answers = {"llm.internal": "10.0.0.7"}

    async def resolver(host, port):
        return [(2, 1, 6, "", (answers[host], port))]

    monkeypatch.setattr(netrules, "_getaddrinfo", resolver)
    assert await resolve_outbound("llm.internal", 8000) == [ipaddress.ip_address("10.0.0.7")]
    with pytest.raises(FetchError):
        await resolve_outbound("llm.internal", 8001)
    answers["llm.internal"] = "169.254.169.254"
    with pytest.raises(FetchError, match="metadata"):
        await resolve_outbound("llm.internal", 8000)


@pytest.mark.django_db
@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
def test_an_mcp_server_url_on_an_internal_address_is_refused_at_save(tenant, transport):
    from capabilities.services import mcp_server_save

    with pytest.raises(ValidationError) as caught:
        mcp_server_save(tenant=tenant, name="evil", alias="evil", transport=transport, url="http://127.0.0.1:6379/mcp")
    assert "url" in caught.value.message_dict
