"""seed_demo's model routes: the Assistant and the Docs assistant on the larger embedded model
with the 0.5B as its fallback, the Researcher on the 0.5B; without a larger model, everything on
the 0.5B (docs/model-accuracy.md: why they get the 1.5B)."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from agents.models import AgentInstance
from llm.models import ModelRouteEntry
from tenants.models import Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(90), pytest.mark.usefixtures("all_tenants_scope")]


def _routes() -> dict[str, str]:
    tenant = Tenant.objects.get(slug="demo")
    return {a.name: a.route.name for a in AgentInstance.all_tenants.filter(tenant=tenant).select_related("route")}


def test_the_assistants_try_the_larger_model_first_and_fall_back_to_the_small_one(settings):
    settings.LLM_BASE_URL = "http://127.0.0.1:8081/v1"
    settings.LLM_LARGE_BASE_URL = "http://127.0.0.1:8083/v1"
    call_command("seed_demo")
    call_command("seed_demo")  # idempotent: the same two entries, not four

    assert _routes() == {"Assistant": "local-large", "Researcher": "local", "Docs assistant": "local-large"}
    entries = ModelRouteEntry.all_tenants.filter(route__name="local-large").select_related("provider").order_by("position")
    assert [(e.position, e.provider.name, e.provider.base_url, e.model) for e in entries] == [
        (0, "local-large", "http://127.0.0.1:8083/v1", "qwen2.5-coder-1.5b-instruct"),
        (1, "local", "http://127.0.0.1:8081/v1", "qwen2.5-coder-0.5b-instruct"),
    ]
    # A larger model that is not running costs one refused connection, not retries with backoff.
    assert [e.max_retries for e in entries][0] == 0
    assert {(e.tool_calls, e.temperature) for e in entries} == {("text", 0.0)}


def test_without_a_larger_model_every_agent_stays_on_the_small_one(settings):
    settings.LLM_LARGE_BASE_URL = ""
    call_command("seed_demo")
    assert _routes() == {"Assistant": "local", "Researcher": "local", "Docs assistant": "local"}

