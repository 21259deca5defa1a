"""The demo tenant's MCP servers (seed_demo): mcp-server-fetch bound to the second demo agent."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from agents.models import AgentInstance, CapabilityBinding, CapabilityKind
from capabilities.services import mcp_server_test_connection
from tenants.models import Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(90), pytest.mark.usefixtures("all_tenants_scope")]


def test_seed_demo_binds_mcp_server_fetch_to_the_researcher() -> None:
    call_command("seed_demo")
    call_command("seed_demo")  # idempotent
    tenant = Tenant.objects.get(slug="demo")
    researcher = AgentInstance.all_tenants.get(tenant=tenant, name="Researcher")
    [binding] = CapabilityBinding.all_tenants.filter(agent=researcher, kind=CapabilityKind.MCP_SERVER)
    server = binding.mcp_server
    assert (server.alias, server.transport, binding.allowed_tools) == ("fetch", "stdio", ["fetch"])
    assert server.template.slug == "mcp-server-fetch" and server.template.network == "egress"
    assert "--allow-private-ips" not in server.template.argv, "the demo fetch server refuses internal addresses"
    result = mcp_server_test_connection(server=server)  # the template's program really starts, confined
    assert result.ok, result.error
    assert "fetch" in [t.name for t in result.tools]
