"""The toolset abstraction (:mod:`capabilities.toolsets`) on its own: no database, no run.

The leaf's mapping of what a tool raises, the named table's own failures, the timeout wrapper
and a wrapper's delegation. The run's order of wrappers and their effect on whole runs are
tested in ``sessions/tests/test_tool_interceptors.py`` and the runner's tests.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from capabilities.tools import ApprovalRequired, QuestionForUser, Tool, ToolContext, ToolError, ToolResult
from capabilities.toolsets import (
    CallWaiting,
    KindToolset,
    NamedToolset,
    TimeoutToolset,
    ToolInvocation,
    ToolOrigin,
    ToolSource,
    WrapperToolset,
)
from llm.types import ToolSpec


class Scripted(Tool):
    """Raises ``raises`` if given, else sleeps ``sleep`` seconds and returns ``"done"``."""

    def __init__(self, *, raises: BaseException | None = None, sleep: float = 0.0, own_timeout: bool = False) -> None:
        self.spec = ToolSpec(name="scripted", description="Scripted.")
        self.raises, self.sleep = raises, sleep
        self.manages_own_timeout = own_timeout

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        await asyncio.sleep(self.sleep)
        if self.raises is not None:
            raise self.raises
        return ToolResult(content="done", data={"n": 1})


def _call(tool: Tool | None, *, approved: bool = False, timeout: float | None = None, **fields: Any) -> ToolInvocation:
    context = ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=7, approved=approved)
    return ToolInvocation(name="scripted", arguments={}, context=context, tool=tool, timeout_seconds=timeout, **fields)


async def test_the_leaf_maps_what_a_tool_raises_to_an_outcome():
    leaf = KindToolset()
    done = await leaf.call_tool(_call(Scripted()))
    assert (done.status, done.content, done.data, done.error) == ("succeeded", "done", {"n": 1}, "")
    failed = await leaf.call_tool(_call(Scripted(raises=ToolError("no such file", code="not_found"))))
    assert (failed.status, failed.error, failed.code) == ("failed", "no such file", "not_found")
    bug = await leaf.call_tool(_call(Scripted(raises=RuntimeError("boom"))))
    assert (bug.status, bug.error) == ("failed", "The tool 'scripted' failed: RuntimeError: boom")
    again = await leaf.call_tool(_call(Scripted(raises=ApprovalRequired("sure?")), approved=True))
    assert (again.status, again.error) == ("failed", "The tool 'scripted' asked for approval again.")


@pytest.mark.parametrize("waits", [ApprovalRequired("sure?"), QuestionForUser("which?"), CallWaiting("sub-run")],
                         ids=["approval", "question", "sub-run"])
async def test_a_call_that_waits_for_a_human_propagates(waits):
    with pytest.raises(type(waits)):
        await KindToolset().call_tool(_call(Scripted(raises=waits)))


async def test_the_named_table_fails_unknown_names_and_invalid_arguments_itself():
    table = NamedToolset()
    table.tools["scripted"], table.tools["other"] = Scripted(), Scripted()
    unknown = await table.call_tool(ToolInvocation(name="nope", arguments={}, context=_call(None).context))
    assert (unknown.status, unknown.code) == ("failed", "unknown_tool")
    assert unknown.error == "Unknown tool 'nope'. Available tools: other, scripted."
    invalid = await table.call_tool(_call(None, arguments_error=ToolError("Send an object.", code="invalid_arguments")))
    assert (invalid.error, invalid.code) == ("Send an object.", "invalid_arguments")
    assert (await table.call_tool(_call(None))).content == "done"  # resolved by its name


async def test_the_timeout_wrapper_times_a_call_out_unless_the_tool_keeps_its_own():
    wrapper = TimeoutToolset(KindToolset())
    late = await wrapper.call_tool(_call(Scripted(sleep=5), timeout=0.05))
    assert (late.status, late.error) == ("timed_out", "The tool 'scripted' timed out after 0.05 s.")
    own = await wrapper.call_tool(_call(Scripted(sleep=0.1, own_timeout=True), timeout=0.01))
    assert own.status == "succeeded"
    raised = await wrapper.call_tool(_call(Scripted(raises=TimeoutError()), timeout=1.0))
    assert raised.status == "timed_out"  # a TimeoutError of the tool itself counts as one


async def test_a_wrapper_delegates_its_tools_and_calls():
    source = ToolSource(origin=ToolOrigin(source="mcp", name="scripted"), factory=lambda exposed: Scripted())
    wrapper = WrapperToolset(KindToolset(sources=[source], qualified=True))
    assert wrapper.tool_sources() == [source] and wrapper.qualified
    assert (await wrapper.call_tool(_call(Scripted()))).content == "done"
