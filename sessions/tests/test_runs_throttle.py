"""The ``runs`` throttle (``API_THROTTLE_RATES`` ``runs.user`` / ``runs.tenant``, issue 34) on
every endpoint that starts or resumes a run besides posting a message (tested in
tenants/tests/test_abuse_controls.py): an approval's decision, edit-and-resend, retry and
regenerate. With the budget at 2 a minute and every other budget unlimited, the third
request is refused with 429 and changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.tests.factories import agent_with_route
from sessions.models import Approval, ApprovalStatus, Message, Run, RunStatus, ToolCall
from sessions.services import chat_session_create, message_post
from tenants.scoping import system_scope, tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_scope", "no_enqueue")]  # requests start unscoped

BUDGET = 2


def _runs_budget(settings, kind: str) -> None:
    """``runs.<kind>`` at :data:`BUDGET` a minute; every other budget unlimited (empty)."""
    rates = dict.fromkeys(settings.API_THROTTLE_RATES, "")
    rates[f"runs.{kind}"] = f"{BUDGET}/minute"
    settings.API_THROTTLE_RATES = rates


def _finished_chat(world):
    """A chat of the world's member with one completed run and its answer."""
    with tenant_scope(world.tenant.pk):
        agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9"])
        session = chat_session_create(user=world.member, agent=agent)
        run = message_post(session=session, user=world.member, content="first question")
        Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED, reply="first answer")
        Message.objects.create(tenant_id=session.tenant_id, session=session, run=run, role="assistant",
                               content="first answer", position=50)
    return session, run


def _pending_approval(world):
    """A run of the world's member paused on a tool call that waits for approval."""
    session, run = _finished_chat(world)
    with tenant_scope(world.tenant.pk):
        Run.objects.filter(pk=run.pk).update(status=RunStatus.AWAITING_APPROVAL)
        call = ToolCall.objects.create(tenant_id=session.tenant_id, run=run, turn=0, call_id="c1", name="t")
        return Approval.objects.create(tenant_id=session.tenant_id, run=run, tool_call=call, tool_name="t",
                                       expires_at=timezone.now() + timedelta(hours=1))


def _approval_decide(world):
    approval = _pending_approval(world)
    return f"/api/v1/approvals/{approval.pk}/", {"decision": "approve"}, approval.run.session_id


def _run_edit(world):
    session, run = _finished_chat(world)
    return f"/api/v1/runs/{run.pk}/edit/", {"content": "first question, edited"}, session.pk


def _run_retry(world):
    session, run = _finished_chat(world)
    return f"/api/v1/runs/{run.pk}/retry/", {}, session.pk


def _session_regenerate(world):
    session, _ = _finished_chat(world)
    return f"/api/v1/sessions/{session.pk}/regenerate/", {}, session.pk


ENDPOINTS = [_approval_decide, _run_edit, _run_retry, _session_regenerate]


def _state(session_id: int) -> tuple:
    """What a request may change: the session's runs (status, superseded) and approvals."""
    with system_scope():
        runs = list(Run.all_tenants.filter(session_id=session_id).order_by("pk")
                    .values_list("pk", "status", "superseded_at"))
        approvals = list(Approval.all_tenants.filter(run__session_id=session_id).values_list("pk", "status"))
    return runs, approvals


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda f: f.__name__.strip("_"))
def test_runs_budget_per_user(world, settings, endpoint):
    url, body, session_id = endpoint(world)
    _runs_budget(settings, "user")
    client = world.client()
    codes = [client.post(url, body, format="json").status_code for _ in range(BUDGET)]
    assert 429 not in codes and codes[0] in (200, 201), codes  # the first one did its work
    before = _state(session_id)
    refused = client.post(url, body, format="json")
    assert refused.status_code == 429, (codes, refused.status_code, refused.content)
    assert 0 < int(refused["Retry-After"]) <= 60
    assert _state(session_id) == before, "the refused request changed nothing"
    # the budget is the user's: another user of the tenant still has theirs
    assert world.client(admin=True).post(url, body, format="json").status_code != 429


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda f: f.__name__.strip("_"))
def test_runs_budget_per_tenant(world, other_world, settings, endpoint):
    url, body, _ = endpoint(world)
    _runs_budget(settings, "tenant")
    codes = [world.client().post(url, body, format="json").status_code for _ in range(BUDGET)]
    assert 429 not in codes, codes
    assert world.client(admin=True).post(url, body, format="json").status_code == 429  # same tenant, spent
    assert other_world.client().post(url, body, format="json").status_code != 429  # another tenant's budget


def test_a_safe_request_spends_no_runs_budget(world, settings):
    url, _, _ = _approval_decide(world)
    _runs_budget(settings, "user")
    client = world.client()
    assert [client.get(url).status_code for _ in range(BUDGET + 1)] == [200] * (BUDGET + 1)
    assert ApprovalStatus.PENDING == client.get(url).json()["status"]
