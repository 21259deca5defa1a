"""The outputs of the client's tools resume the run their calls paused.

A request carrying them (chat completions' trailing ``tool`` messages, the Responses API's
``function_call_output`` items) names each call by its id ``call_<ToolCall pk>``
(:mod:`.client_tools`). The calls must all be the caller's, of one run of the requested agent,
and that run must wait for exactly these outputs; the outputs then become the calls' results
and the same run goes on (:func:`sessions.services.client_tool_outputs_submit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance
from sessions.api.openai_compat.client_tools import call_id, call_pk_of
from sessions.api.openai_compat.errors import OpenAIError
from sessions.api.openai_compat.responses import Segments
from sessions.events import session_seq_sync
from sessions.models import Run, ToolCall
from sessions.services import client_tool_outputs_submit


@dataclass(frozen=True, slots=True)
class Started:
    """A request's run: its chat, its id, and the ``seq`` after which its answer's events come
    (0: from the chat's start; for a resumed run, the last event before the resume)."""

    session_id: int
    run_id: int
    after_seq: int = 0
    run: Run | None = None
    """The run row (when the request resumed it)."""
    segment: int = 0
    """The Responses API's segment of the run the request's answer is (:class:`.responses.Segments`)."""


def _not_waiting(call: str, param: str) -> OpenAIError:
    return OpenAIError(400, f"No call {call!r} of yours waits for an output.", param=param,
                       code="tool_call_not_found")


def run_resume_with_outputs(*, user: AbstractBaseUser, agent: AgentInstance, outputs: dict[str, str],
                            params: dict[str, str], outputs_param: str, run_id: int | None = None) -> Started:
    """Resume the caller's run paused on the calls ``outputs`` answers. Requires the caller's
    tenant scope.

    Args:
        outputs: ``{call id: output text}``.
        params: ``{call id: the request field that carries it}`` (for the errors' ``param``).
        outputs_param: The field that holds the outputs (``messages``, ``input``): the
            ``param`` of a missing output.
        run_id: The run the calls must be of (the Responses API's ``previous_response_id``),
            or None (found from the calls).

    Raises:
        OpenAIError: 400 ``tool_call_not_found`` naming a call id that is not ours, not of this
            agent or run, or not waiting; 400 ``tool_output_missing`` naming a waiting call with
            no output; 409 ``run_not_waiting`` when the run waits for nothing (it ended, or its
            wait expired: it then failed ``approval_expired``).
    """
    by_pk: dict[int, str] = {}
    for call, text in outputs.items():
        pk = call_pk_of(call)
        if pk is None:
            raise _not_waiting(call, params[call])
        by_pk[pk] = text
    runs = dict(ToolCall.objects.filter(pk__in=by_pk, run__user_id=user.pk, run__session__agent_id=agent.pk)
                .values_list("pk", "run_id"))
    expected = run_id if run_id is not None else next(iter(runs.values()), None)
    for pk in by_pk:
        if runs.get(pk) is None or runs[pk] != expected:
            raise _not_waiting(call_id(pk), params.get(call_id(pk), outputs_param))
    run = Run.objects.get(pk=expected)
    after_seq = session_seq_sync(run.session_id)
    segment = len(Segments.of(run).parts)  # while it waits: the index of the segment its outputs start
    try:
        client_tool_outputs_submit(run=run, outputs=by_pk, user=user)
    except ApplicationError as exc:
        raise _submit_error(exc, params, outputs_param) from exc
    return Started(session_id=run.session_id, run_id=run.pk, after_seq=after_seq, run=run, segment=segment)


def _submit_error(exc: ApplicationError, params: dict[str, str], outputs_param: str) -> OpenAIError:
    if exc.extra.get("missing"):
        missing = call_id(exc.extra["missing"][0])
        return OpenAIError(400, f"The call {missing!r} waits for its output too; send every output at once.",
                           param=outputs_param, code="tool_output_missing")
    if exc.extra.get("unknown"):
        unknown = call_id(exc.extra["unknown"][0])
        return _not_waiting(unknown, params.get(unknown, outputs_param))
    return OpenAIError(409, exc.message, code="run_not_waiting")
