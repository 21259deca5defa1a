"""Setup helpers of the console (server side): the provider's Test and model list, the route's
one-click Test and plain-word health, the binding form's fields, search on every list."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from agents.models import CapabilityBinding
from agents.tests.factories import ProviderFactory, agent_with_route
from console.forms import BindingForm
from console.providers import provider_models
from llm.testing import FakeLLMServer
from tenants.crypto import secret_encrypt

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_provider_models_lists_the_providers_models_through_the_llm_clients(world):
    with FakeLLMServer(model="qwen-test-7b") as server:
        provider = ProviderFactory(tenant=world.tenant, name="local", base_url=server.base_url)
        result = provider_models(provider=provider, use_cache=False)
    assert result["ok"] and result["models"] == ["qwen-test-7b"] and not result["cached"]
    # Cached for the route form; the Test button asks again.
    assert provider_models(provider=provider)["cached"] is True


def test_provider_models_failure_is_classified_and_the_key_never_shown(world, settings):
    provider = ProviderFactory(tenant=world.tenant, name="down", base_url="http://127.0.0.1:9/v1")
    provider.api_key_encrypted = secret_encrypt(tenant=world.tenant, plaintext="sk-very-secret-key-123456")
    provider.save()
    result = provider_models(provider=provider, use_cache=False)
    assert not result["ok"] and result["error_class"] in {"network", "timeout"}
    assert "sk-very-secret" not in result["error"]


def test_provider_models_refuses_an_address_the_outbound_rules_forbid(world, settings):
    settings.OUTBOUND_ALLOWED_CIDRS = []
    with FakeLLMServer() as server:
        provider = ProviderFactory(tenant=world.tenant, name="loopback", base_url=server.base_url)
        result = provider_models(provider=provider, use_cache=False)
        assert not result["ok"] and server.requests == []


def test_provider_test_button_and_models_json_are_held_to_the_tenant(world, other_world):
    with FakeLLMServer(model="m-1") as server:
        provider = ProviderFactory(tenant=world.tenant, name="mine", base_url=server.base_url)
        client = _console(world.admin)
        response = client.post(reverse("admin:llm_modelprovider_test", args=[provider.pk]), follow=True)
        assert "answered in" in response.content.decode() and "m-1" in response.content.decode()
        assert client.get(reverse("admin:llm_modelprovider_models", args=[provider.pk])).json()["models"] == ["m-1"]
        other = _console(other_world.admin)
        assert other.post(reverse("admin:llm_modelprovider_test", args=[provider.pk])).status_code == 404
        assert other.get(reverse("admin:llm_modelprovider_models", args=[provider.pk])).status_code == 404
        assert client.get(reverse("admin:llm_modelprovider_test", args=[provider.pk])).status_code == 405


def test_route_test_button_and_plain_health(world, other_world):
    with FakeLLMServer() as server:
        agent = agent_with_route(tenant=world.tenant, base_urls=[server.base_url], name="R")
        route = agent.route
        from llm.testing import Reply

        server.script(Reply("pong"))
        client = _console(world.admin)
        page = client.get(reverse("admin:llm_modelroute_change", args=[route.pk])).content.decode()
        assert "Working normally" in page and 'data-testid="route-test"' in page
        response = client.post(reverse("admin:llm_modelroute_test", args=[route.pk]), follow=True)
        assert "OK in" in response.content.decode()
        assert _console(other_world.admin).post(reverse("admin:llm_modelroute_test", args=[route.pk])).status_code == 404


def test_binding_form_policy_rows_builtin_list_and_tool_list(world, other_world):
    from capabilities.models import McpServer

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="B")
    form = BindingForm()
    names = [c[0] for c in form.fields["builtin_name"].choices]
    assert "todo_write" in names and "ask_user" in names
    data = {
        "tenant": world.tenant.pk, "agent": agent.pk, "kind": "builtin", "builtin_name": "todo_write",
        "allowed_tools": "a, b", "approval_policy-pattern-0": "delete_*", "approval_policy-action-0": "ask",
        "approval_policy-pattern-1": "", "approval_policy-action-1": "deny",
        "approval_policy-pattern-2": "*", "approval_policy-action-2": "allow", "config": "{}", "enabled": "on",
    }
    form = BindingForm(data=data)
    assert form.is_valid(), form.errors
    assert form.cleaned_data["approval_policy"] == [{"pattern": "delete_*", "action": "ask"},
                                                    {"pattern": "*", "action": "allow"}]
    assert form.cleaned_data["allowed_tools"] == ["a", "b"]
    as_json = BindingForm(data={**data, "allowed_tools": '["x", "y"]'})
    assert as_json.is_valid() and as_json.cleaned_data["allowed_tools"] == ["x", "y"]
    assert not BindingForm(data={**data, "allowed_tools": '[1, 2'}).is_valid()
    bad = BindingForm(data={**data, "approval_policy-action-0": "maybe"})
    assert not bad.is_valid() and "approval_policy" in bad.errors
    # The tool lists offered are only the admin's tenant's servers'.
    McpServer.all_tenants.create(tenant=other_world.tenant, name="theirs", alias="theirs", transport="streamable_http",
                                 url="https://x.example/mcp", tools_snapshot=[{"name": "secret_tool"}])
    page = _console(world.admin).get(reverse("admin:agents_capabilitybinding_add")).content.decode()
    assert "secret_tool" not in page and "data-server-tools" in page


def test_every_console_list_is_searchable():
    missing = [f"{m._meta.app_label}.{m._meta.model_name}" for m, ma in admin.site._registry.items()
               if not ma.search_fields]
    assert missing == [], missing


def test_the_builtin_binding_saved_through_the_form_works(world):
    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="S")
    client = _console(world.admin)
    response = client.post(reverse("admin:agents_capabilitybinding_add"), {
        "agent": agent.pk, "kind": "builtin", "builtin_name": "todo_write", "allowed_tools": "",
        "approval_policy-pattern-0": "todo_*", "approval_policy-action-0": "deny", "config": "{}", "enabled": "on",
    })
    assert response.status_code == 302, response.content.decode()[:3000]
    binding = CapabilityBinding.all_tenants.get(agent=agent)
    assert binding.approval_policy == [{"pattern": "todo_*", "action": "deny"}]
