"""A run's answer to an outside server that asks for a completion during one of its tool calls
(MCP sampling, :mod:`capabilities.mcp.sampling`): :func:`run_sampler` makes the run's
:data:`capabilities.tools.ModelSampler`, which each tool call gets as ``ToolContext.sample``.

The request goes through the run's current model route (the agent's, or the one its routing
rules chose for the turn) with the route's retries and fallback, after the same budget check a
model turn has (the agent's per-run tokens and cost, the tenant's month). Each attempt is an
``LLMCall`` row with purpose ``sampling``, the run and the turn whose tool call asked, and is
added to the run's totals, so usage pages and the run's budget count it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capabilities.tools import ModelSampler, SamplingRequest, ToolError
from llm.metering import LLMCallPurpose
from llm.records import AttemptRecord
from llm.tokens import estimate_tokens
from llm.types import Completion
from sessions.runner.turn import budget_exceeded

if TYPE_CHECKING:
    from sessions.runner.ports import RunPorts
    from sessions.runner.turn import RunState

SAMPLING_REQUEST = "an MCP server's sampling request"
"""How a budget refusal names the request (see :func:`sessions.runner.turn.budget_exceeded`)."""


def run_sampler(state: RunState, ports: RunPorts) -> ModelSampler:
    """The sampler of the run ``state`` belongs to (see the module docstring).

    The returned ``sample(request)`` raises :class:`~capabilities.tools.ToolError`
    ``budget_exceeded`` (nothing called, nothing recorded) or the router's
    :class:`~llm.errors.LLMError` (its failed attempts recorded).
    """

    async def sample(request: SamplingRequest) -> Completion:
        spec, store, turn = state.spec, state.store, state.record.turn
        prompt_tokens = estimate_tokens(request.messages, request.tools)
        refusal = await budget_exceeded(spec, store, prompt_tokens=prompt_tokens, entry_index=state.current_entry,
                                        request=SAMPLING_REQUEST)
        if refusal:
            raise ToolError(refusal, code="budget_exceeded")

        async def record(attempt: AttemptRecord) -> None:
            await store.llm_call_record(spec=spec, turn=turn, record=attempt, purpose=LLMCallPurpose.SAMPLING.value)

        model = ports.model(spec, record, state.publish)
        return await model.complete(list(request.messages), list(request.tools),
                                    max_output_tokens=request.max_output_tokens)

    return sample
