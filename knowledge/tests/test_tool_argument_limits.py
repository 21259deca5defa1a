"""The agents' ``knowledge_search`` tool (knowledge/tools.py) keeps the REST search's argument
limits (issue 34): more than 1,000 ``document_ids``, more than 20 tags, a tag over 64
characters, a NUL character. Each such call is a failed tool call whose reason the model
reads, never a database error (a NUL is refused by PostgreSQL; 100,000 ids are more than a
query should carry) or an unhandled exception, and the run goes on.

Real PostgreSQL, the real embedded embedder (``embedding_server``), the scripted model server
(``fake_llm``), the run engine.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from knowledge.tests.test_kind import SAILING, _agent, _calls, _kb
from llm.testing import Reply, ToolCalls
from sessions.models import Run
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message_sync

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

run_now = async_to_sync(execute_run)


@pytest.fixture
def no_ingest_task(monkeypatch):
    monkeypatch.setattr("knowledge.tasks.document_ingest_enqueue", lambda **kwargs: None)


def test_arguments_over_the_rest_searchs_limits_fail_the_call_with_the_reason(world, fake_llm, embedding_server,
                                                                               no_enqueue, no_ingest_task):
    kb = _kb(world.tenant, embedding_server, "Club", SAILING)
    agent = _agent(world, fake_llm, {"knowledge_bases": [kb.pk]})
    fake_llm.script(ToolCalls([
        ("knowledge_search", {"query": "boats", "filters": {"document_ids": list(range(1, 1002))}}),
        ("knowledge_search", {"query": "boats", "filters": {"tags": [f"tag{i}" for i in range(21)]}}),
        ("knowledge_search", {"query": "boats", "filters": {"tags": ["x" * 65]}}),
        ("knowledge_search", {"query": "boats", "filters": {"document_ids": list(range(1, 1001))}}),  # at the cap
    ]), Reply("Done."))
    run = post_message_sync(agent=agent, user=world.member, content="Boats?")
    run_now(run.pk)

    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    many_ids, many_tags, long_tag, at_cap = _calls(run.pk)
    for call, reason in ((many_ids, "filters.document_ids: Ensure this field has no more than 1000 elements."),
                         (many_tags, "filters.tags: Ensure this field has no more than 20 elements."),
                         (long_tag, "filters.tags: Ensure this field has no more than 64 characters.")):
        assert (call.status, call.error) == ("failed", f"Invalid arguments: {reason}")
    assert at_cap.status == "succeeded", at_cap.error
    model_saw = "\n".join(str(m.get("content")) for m in fake_llm.requests[1]["messages"])
    assert "filters.document_ids: Ensure this field has no more than 1000 elements." in model_saw
    assert "64 characters" in model_saw


def test_a_nul_or_100000_ids_are_refused_by_the_tool_itself(world, embedding_server, no_ingest_task):
    """Arguments reach ``execute`` from other callers than the run engine (which replaces a
    model's NULs, and whose model could not send 100,000 ids within its context window): the
    tool refuses them with the reason instead of sending them to PostgreSQL (which refuses a
    NUL, and more than 65,535 query parameters)."""
    from asgiref.sync import sync_to_async

    from capabilities.tools import ToolContext, ToolError
    from knowledge.tools import CitationNumbers, KnowledgeSearchTool, Retrieval, SearchScope
    from tenants.scoping import tenant_scope

    kb = _kb(world.tenant, embedding_server, "Club", SAILING)

    def in_thread(fn):
        def scoped(*args, **kwargs):
            with tenant_scope(world.tenant.pk):
                return fn(*args, **kwargs)

        return sync_to_async(scoped, thread_sensitive=True)

    numbers = CitationNumbers()
    tool = KnowledgeSearchTool(exposed="knowledge_search", default_top_k=3, numbers=lambda: numbers,
                               description="Club", retrieval=Retrieval(
                                   scope=SearchScope(tenant_id=world.tenant.pk, knowledge_base_ids=(kb.pk,),
                                                     user_id=None), in_thread=in_thread))
    context = ToolContext(tenant_id=world.tenant.pk, session_id=0, run_id=0, tool_call_id=0)
    execute = async_to_sync(tool.execute)
    assert "opens at 8" in execute({"query": "When does the boathouse open?"}, context).content  # the ports work

    for arguments, reason in (
            ({"query": "boats\x00"}, "query: Null characters are not allowed."),
            ({"query": "boats", "filters": {"tags": ["a\x00b"]}}, "filters.tags: Null characters are not allowed."),
            ({"query": "boats", "filters": {"document_ids": list(range(1, 100_001))}},
             "filters.document_ids: Ensure this field has no more than 1000 elements.")):
        with pytest.raises(ToolError) as caught:
            execute(arguments, context)
        assert (caught.value.code, caught.value.message) == ("invalid_arguments", f"Invalid arguments: {reason}")
