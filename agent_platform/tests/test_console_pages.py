"""Every page of the console (Django admin) renders, for a tenant admin and a superuser.

The data is what a user has after ``seed_demo`` and one finished run with a tool call (runs,
messages, tool calls, LLM calls, a compaction-free session), so each model's list, search,
add form and change form runs its real queries: an error in any of them (an annotation or a
filter PostgreSQL refuses, e.g. with server-side parameter binding) fails here rather than
as a 500 in the console.
"""

from __future__ import annotations

import asyncio

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.urls import reverse

from agents.tests.factories import agent_with_route, bind_builtin
from llm.testing import Reply, ToolCalls
from sessions.models import LLMCall, Run, ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync
from tenants.models import Tenant

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture
def console_data(fake_llm):
    call_command("seed_demo", verbosity=0)
    demo = Tenant.objects.get(slug="demo")
    agent = agent_with_route(tenant=demo, base_urls=[fake_llm.base_url], name="Pages")
    bind_builtin(agent, "test_echo")
    fake_llm.script(ToolCalls([("test_echo", {"text": "hi"})]), Reply("done"))
    run = post_message_sync(agent=agent, user=get_user_model().objects.get(username="demo-user"), content="go")
    asyncio.run(execute_run(run.pk))
    assert Run.all_tenants.get(pk=run.pk).status == "completed"
    assert ToolCall.all_tenants.filter(run_id=run.pk).exists() and LLMCall.all_tenants.filter(run_id=run.pk).exists()
    return demo


class _Refused:
    status_code = 403


def _get(client, url: str, data=None):
    """The test client re-raises what the admin raises; a refusal is a 403 page to a user."""
    try:
        return client.get(url, data)
    except PermissionDenied:
        return _Refused()


def _walk(client) -> list[str]:
    """GET every registered model's list (plain, searched, with filter counts), add form and
    first change form."""
    seen = []
    for model, model_admin in admin.site._registry.items():
        info = (model._meta.app_label, model._meta.model_name)
        changelist_url = reverse("admin:%s_%s_changelist" % info)
        changelist = _get(client, changelist_url)
        assert changelist.status_code in (200, 302, 403), (info, changelist.status_code)
        if changelist.status_code != 200:
            continue
        seen.append("%s.%s" % info)
        if model_admin.search_fields:
            assert _get(client, changelist_url, {"q": "a"}).status_code == 200, info
        if model_admin.list_filter:  # the filters with their counts ("Show counts")
            assert _get(client, changelist_url, {"_facets": "True"}).status_code == 200, info
        add = _get(client, reverse("admin:%s_%s_add" % info))
        assert add.status_code in (200, 403), (info, add.status_code)
        objects = changelist.context["cl"].result_list
        if objects:
            change = _get(client, reverse("admin:%s_%s_change" % info, args=[objects[0].pk]))
            if change.status_code == 302 and change["Location"].endswith(("/trace/", "/transcript/")):
                # a run opens as its trace, a session as its transcript
                change = _get(client, change["Location"])
            assert change.status_code == 200, (info, change.status_code)
    return seen


def test_every_console_page_renders_for_the_tenant_admin(client, console_data):
    client.login(username="demo-admin", password="demo-admin-pass")
    seen = _walk(client)
    assert {"agents.agentinstance", "agent_sessions.run", "agent_sessions.llmcall", "llm.modelroute"} <= set(seen), seen


def test_every_console_page_renders_for_a_superuser(client, console_data):
    get_user_model().objects.create_superuser(username="root-admin", password="pw-root-123")
    client.login(username="root-admin", password="pw-root-123")
    seen = _walk(client)
    # Memories are their users' data: shown only to admins of the memory's tenant, and a platform
    # superuser without a membership is not one (memory/admin.py).
    private = {"memory.memory"}
    assert set(seen) == {"%s.%s" % (m._meta.app_label, m._meta.model_name) for m in admin.site._registry} - private
    assert _get(client, reverse("admin:memory_memory_changelist")).status_code == 403
