"""The runner with a bound CLI command: the scripted model calls it, a real sandbox runs it."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route
from capabilities.confinement import bwrap_resolve
from capabilities.models import CliCommand
from capabilities.tests.catalogue import cli_template
from llm.testing import Reply, ToolCalls
from sessions.events import events_since
from sessions.models import ToolCall
from sessions.runner.loop import execute_run
from sessions.tests.conftest import post_message, reload_run
from tenants.crypto import secret_encrypt_json

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.timeout(120),
    pytest.mark.skipif(bwrap_resolve("bwrap") is None, reason="bubblewrap is not installed (scripts/bootstrap.sh)"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

SCRIPT = (
    "import os, sys\n"
    "print('factoring', sys.argv[1], flush=True)\n"
    "print('token', os.environ.get('API_TOKEN'), flush=True)\n"
    "os.execvp('factor', ['factor', '--', sys.argv[1]])\n"
)


@database_sync_to_async
def agent_with_cli(world, url, **command_fields):
    agent = agent_with_route(tenant=world.tenant, base_urls=[url])
    template = cli_template(
        "factor-script", ["python3", "-c", SCRIPT, "{n}"],
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]},
        secrets=["API_TOKEN"],
    )
    fields = {
        "name": "factor", "description": "Prime factors of n.", "template": template,
        "env_encrypted": secret_encrypt_json(tenant=world.tenant, value={"API_TOKEN": "tok-from-the-vault"}),
    }
    fields.update(command_fields)
    command = CliCommand(tenant=world.tenant, **fields)
    command.full_clean()
    command.save()
    CapabilityBinding.all_tenants.create(tenant=world.tenant, agent=agent, kind=CapabilityKind.CLI, cli_command=command)
    return agent


@database_sync_to_async
def tool_calls(run_id):
    return list(ToolCall.all_tenants.filter(run_id=run_id).order_by("id"))


async def test_the_model_calls_a_cli_command_and_reads_its_output(world, fake_llm):
    agent = await agent_with_cli(world, fake_llm.base_url)
    fake_llm.script(
        ToolCalls([("factor", {"n": 360}), ("factor", {"n": "360; id"})]),
        Reply("360 = 2^3 · 3^2 · 5."),
    )
    run = await post_message(agent=agent, user=world.member, content="Factor 360.")
    await execute_run(run.pk)
    run = await reload_run(run.pk)
    assert run.status == "completed", run.error

    offered = fake_llm.requests[0]["tools"]
    assert [t["function"]["name"] for t in offered] == ["factor"]
    assert offered[0]["function"]["description"] == "Prime factors of n."
    assert offered[0]["function"]["parameters"]["required"] == ["n"]

    good, injected = await tool_calls(run.pk)
    assert good.status == "succeeded", good.error
    assert good.result == (
        "exit code 0\n--- stdout ---\nfactoring 360\ntoken tok-from-the-vault\n360: 2 2 2 3 3 5"
    ), "the decrypted env var reached the sandboxed command"
    assert good.result_data["exit_code"] == 0 and good.result_data["timed_out"] is False
    assert injected.status == "failed" and injected.error.startswith("Invalid arguments: n: '360; id' is not of type")

    tool_messages = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"].startswith("<untrusted-data nonce=")
    assert "360: 2 2 2 3 3 5" in tool_messages[0]["content"], "the output reaches the model, framed as data"
    assert tool_messages[1]["content"].startswith("Error: Invalid arguments")

    events = await events_since(session_id=run.session_id, after_seq=0)
    progress = [e["data"] for e in events if e["type"] == "tool_call_progress"]
    assert progress and all(p["tool_call_id"] == good.pk for p in progress)
    assert "".join(p["message"] for p in progress) == good.result_data["stdout"]


async def test_a_sandboxed_command_refuses_without_bwrap_and_the_run_goes_on(world, fake_llm, settings):
    settings.CLI_BWRAP_PATH = "/nonexistent/bwrap"
    agent = await agent_with_cli(world, fake_llm.base_url)
    fake_llm.script(ToolCalls([("factor", {"n": 12})]), Reply("The sandbox is missing."))
    run = await post_message(agent=agent, user=world.member, content="Factor 12.")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    [call] = await tool_calls(run.pk)
    assert call.status == "failed" and "bubblewrap ('/nonexistent/bwrap') is not installed" in call.error


async def test_a_disabled_command_is_not_offered(world, fake_llm):
    agent = await agent_with_cli(world, fake_llm.base_url, enabled=False)
    fake_llm.script(Reply("No tools."))
    run = await post_message(agent=agent, user=world.member, content="Factor 12.")
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    assert "tools" not in fake_llm.requests[0] or not fake_llm.requests[0]["tools"]
