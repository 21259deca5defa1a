"""The views of ``/api/openai/v1``: ``GET /models``, ``GET /models/<slug>``, ``POST /chat/completions``.

Plain async Django views (a streamed answer holds no thread while the run works). Every
request authenticates with an API token (``Authorization: Bearer <token>``: a token is one
membership, so it decides the tenant); a member sees the active agents of that tenant only,
and another tenant's slug is the same ``model_not_found`` as a missing one.

A chat completion is a run: the request's ``messages`` become a new chat of the token's user
(:func:`sessions.services.chat_from_conversation`), or, with ``metadata.chat_id`` / the
``X-Chat-Id`` header, the last message is posted to that chat (its stored history applies). The
answer is read from the session's events through :class:`sessions.event_reader.SessionEventReader`,
the reader the WebSocket and the SSE view use, and encoded by :mod:`.completion`. The run
counts against the ``messages`` and ``runs`` throttles and the user's open streams, like a
message posted in the app.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance, AgentVersion
from agents.versions import split_pinned_slug
from sessions.api import agent_runs
from sessions.api.agent_runs import (
    AGENT_NOT_FOUND,
    RunRefused,
    agent_run_start,
    answer_reader,
    answer_slot_release,
    answer_slot_take,
    chat_continue,
    run_start_gate,
)
from sessions.api.openai_compat.chat_request import ChatRequest, chat_request_parse
from sessions.api.openai_compat.completion import Completion, RunEnd, ends_answer, frame_delta, usage_of
from sessions.api.openai_compat.errors import OpenAIError
from sessions.api.openai_compat.images import ImageInput
from sessions.api.openai_compat.responses import ResponseStream, response_body, response_opening, response_ref_of
from sessions.api.openai_compat.responses_request import ResponsesRequest, responses_request_parse
from sessions.api.openai_compat.resume import Started, run_resume_with_outputs
from sessions.chat_services import run_images_attach
from sessions.event_reader import Closed, Event, SessionEventReader
from sessions.models import ACTIVE_RUN_STATUSES, Run
from sessions.selectors import run_get_for_user
from sessions.services import chat_from_conversation, message_post, run_cancel
from tenants.resolution import Caller, caller_resolve
from tenants.scoping import tenant_scope

S = TypeVar("S")

VERSIONS_LISTED = 3
"""``GET /models`` lists, after each agent, its newest versions as ``slug@<n>`` (at most this
many, newest first, plus the published one if older); any version can be named, listed or not."""
THROTTLE_SCOPES = agent_runs.THROTTLE_SCOPES
"""The budgets a chat completion spends (those of posting a message in the app)."""


def _model_not_found(slug: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{slug}` does not exist or you do not have access to it.",
                       code="model_not_found", param="model")


@database_sync_to_async
def _authenticate(request: HttpRequest) -> Caller:
    """The token's caller. Raises OpenAIError 401 (no, malformed or revoked token; no membership)."""
    header = request.headers.get("Authorization", "")
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise OpenAIError(401, "Send your API token as `Authorization: Bearer <token>`.", code="invalid_api_key")
    caller = caller_resolve(raw_token=raw.strip())
    if caller is None or caller.membership is None:
        raise OpenAIError(401, "Invalid or revoked API token.", code="invalid_api_key")
    return caller


def _model(agent: AgentInstance) -> dict[str, Any]:
    return {"id": agent.slug, "object": "model", "created": int(agent.created_at.timestamp()),
            "owned_by": agent.tenant.slug, "name": agent.name, "description": agent.description}


def _version_model(agent: AgentInstance, version: AgentVersion) -> dict[str, Any]:
    """Version ``version`` of ``agent`` as a model: ``id`` ``slug@<n>``, ``created`` the version's."""
    return {**_model(agent), "id": f"{agent.slug}@{version.number}", "created": int(version.created_at.timestamp()),
            "version": version.number, "published": version.pk == agent.published_version_id}


def _listed_versions(agents: list[AgentInstance]) -> dict[int, list[AgentVersion]]:
    """Per agent id: its :data:`VERSIONS_LISTED` newest versions and its published one, newest
    first (one query; two when a published version is older). Requires the tenant's scope."""
    from django.db.models import F, Window
    from django.db.models.functions import RowNumber

    newest = list(AgentVersion.objects.filter(agent_id__in=[a.pk for a in agents]).defer("config").annotate(
        rank=Window(RowNumber(), partition_by=[F("agent_id")], order_by=F("number").desc()),
    ).filter(rank__lte=VERSIONS_LISTED))
    older = {a.published_version_id for a in agents if a.published_version_id} - {v.pk for v in newest}
    if older:
        newest += AgentVersion.objects.filter(pk__in=older).defer("config")
    by_agent: dict[int, list[AgentVersion]] = {}
    for version in sorted(newest, key=lambda v: (v.agent_id, -v.number)):
        by_agent.setdefault(version.agent_id, []).append(version)
    return by_agent


@database_sync_to_async
def _models(caller: Caller, slug: str | None = None) -> list[dict[str, Any]]:
    """The caller's active agents as models (``slug``: only that one; ``slug@n``: version ``n``
    of it, when the agent has that version, ``id`` ``slug@n``)."""
    number = None
    if slug is not None:
        slug, number = split_pinned_slug(slug)
    with tenant_scope(caller.membership.tenant_id):
        agents = AgentInstance.objects.filter(is_active=True).select_related("tenant").order_by("slug")
        if slug is not None:
            agents = agents.filter(slug=slug)
        if number is not None:
            versions = (AgentVersion.objects.filter(agent__in=agents, number=number).defer("config")
                        .select_related("agent__tenant"))
            return [_version_model(version.agent, version) for version in versions]
        agents = list(agents)
        if slug is not None:
            return [_model(agent) for agent in agents]
        versions = _listed_versions(agents)
        return [model for agent in agents
                for model in (_model(agent), *(_version_model(agent, v) for v in versions.get(agent.pk, [])))]


def _method_not_allowed(allowed: str) -> JsonResponse:
    response = OpenAIError(405, f"Use {allowed}.", code="method_not_allowed").response()
    response["Allow"] = allowed
    return response


@csrf_exempt
async def models_list(request: HttpRequest) -> HttpResponse:
    """``GET /models``: ``{"object": "list", "data": [model...]}``, one per active agent of the
    token's tenant (``id``: the agent's slug), each followed by its newest versions
    (:data:`VERSIONS_LISTED`, and the published one) as ``slug@<n>`` (``version``: n,
    ``published``: whether it is the one ``slug`` runs)."""
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        caller = await _authenticate(request)
    except OpenAIError as exc:
        return exc.response()
    return JsonResponse({"object": "list", "data": await _models(caller)})


@csrf_exempt
async def model_get(request: HttpRequest, model_id: str) -> HttpResponse:
    """``GET /models/<slug>``: one model, or 404 ``model_not_found``."""
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        caller = await _authenticate(request)
        found = await _models(caller, slug=model_id)
        if not found:
            raise _model_not_found(model_id)
    except OpenAIError as exc:
        return exc.response()
    return JsonResponse(found[0])


def _start_run(caller: Caller, model: str, post: Callable[[AgentInstance], Run]) -> tuple[int, int]:
    """:func:`sessions.api.agent_runs.agent_run_start` of the agent ``model``, its refusal in
    OpenAI's shape (:func:`_refusal`)."""
    try:
        return agent_run_start(caller, model, post)
    except RunRefused as exc:
        raise _refusal(exc, model) from exc


def _refusal(exc: RunRefused, model: str) -> OpenAIError:
    """A refused run in OpenAI's shape: 404 ``model_not_found``, 429 ``rate_limit_error`` (with
    ``Retry-After``), else the refusal's status, message, code and param."""
    if exc.code == AGENT_NOT_FOUND:
        return _model_not_found(model)
    if exc.status == 429:
        return OpenAIError(429, exc.message, type="rate_limit_error", code=exc.code, retry_after=exc.retry_after)
    return OpenAIError(exc.status, exc.message, code=exc.code, param=exc.param)


@database_sync_to_async
def _start(caller: Caller, chat: ChatRequest) -> Started:
    """A chat completion's run (:func:`_start_run`): a new one, or the run the request's tool
    outputs resume (its answer's events come after ``after_seq``)."""
    resumed: list[Started] = []

    def post(agent: AgentInstance) -> Run:
        if not chat.tool_outputs:
            return _post(caller, agent, chat)
        resumed.append(run_resume_with_outputs(user=caller.user, agent=agent, outputs=chat.tool_outputs,
                                               params=chat.tool_output_params, outputs_param="messages"))
        return resumed[0].run

    session_id, run_id = _start_run(caller, chat.model, post)
    return Started(session_id=session_id, run_id=run_id, after_seq=resumed[0].after_seq if resumed else 0)


@transaction.atomic  # the images are attached before the run is handed to a worker (on commit)
def _post(caller: Caller, agent: AgentInstance, chat: ChatRequest) -> Run:
    if chat.chat_id is None:
        run = chat_from_conversation(user=caller.user, agent=agent, history=chat.history, content=chat.content,
                                     request_options=chat.request_options())
    else:
        run = chat_continue(caller, agent, chat_id=chat.chat_id, content=chat.content, param="metadata.chat_id",
                            request_options=chat.request_options())
    return _with_images(run, chat.images)


def _with_images(run: Run, images: tuple[ImageInput, ...]) -> Run:
    """``run`` with ``images`` attached to its message (:func:`sessions.chat_services.run_images_attach`)."""
    return run_images_attach(run=run, images=[i.as_tuple() for i in images]) if images else run


@database_sync_to_async
def _usage(tenant_id: int, run_id: int) -> dict[str, int]:
    with tenant_scope(tenant_id):
        tokens = Run.objects.filter(pk=run_id).values_list("prompt_tokens", "completion_tokens").first()
    return usage_of(*(tokens or (0, 0)))


async def _frames_until(reader: SessionEventReader, last: Callable[[dict[str, Any]], bool],
                        ) -> AsyncIterator[dict[str, Any] | None]:
    """The session's frames (decoded) until the one ``last`` says is the last (yielded too);
    ``None`` for a keep-alive.

    Raises:
        OpenAIError: 503 when the stream ends first (the token was revoked, the server stops).
    """
    async for item in reader:
        if isinstance(item, Event):
            frame = json.loads(item.text)
            yield frame
            if last(frame):
                return
        elif isinstance(item, Closed):
            raise OpenAIError(503, f"The answer's stream ended: {item.reason.replace('_', ' ')}.", type="server_error",
                              code=item.reason)
        else:
            yield None


async def _run_items(reader: SessionEventReader, run_id: int, *,
                     at_person_pause: bool = False) -> AsyncIterator[dict[str, str] | RunEnd | None]:
    """The run's deltas, then its :class:`RunEnd` (the last item: its end, its pause on the
    client's tools, with ``at_person_pause`` its pause for a person's decision); ``None`` for a
    keep-alive. Raises OpenAIError 503 (:func:`_frames_until`)."""
    async for frame in _frames_until(reader, lambda f: ends_answer(f, run_id, at_person_pause=at_person_pause)):
        found = None if frame is None else frame_delta(frame, run_id=run_id, at_person_pause=at_person_pause)
        if frame is None or found is not None:
            yield found


async def _start_on_slot(caller: Caller, start: Callable[[], Awaitable[S]],
                         started_of: Callable[[S], Started] = lambda s: s) -> tuple[S, SessionEventReader]:
    """One of the caller's stream slots first (a refused slot starts no run: OpenAIError 429),
    then ``start()`` (the run, in a turn of :func:`~sessions.api.agent_runs.run_start_gate`; the
    slot freed if it raises), then the reader of the run's session
    (``started_of`` its result) after its ``after_seq`` on that slot (:mod:`sessions.api.agent_runs`)."""
    try:
        slot = await answer_slot_take(caller)
    except RunRefused as exc:
        raise OpenAIError(429, exc.message, type="rate_limit_error", code=exc.code,
                          retry_after=exc.retry_after) from exc
    try:
        async with run_start_gate():
            started = await start()
    except BaseException:
        await answer_slot_release(caller, slot)
        raise
    found = started_of(started)
    return started, answer_reader(caller, found.session_id, slot=slot, after_seq=found.after_seq)


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """``POST /chat/completions``: a run of the agent ``model``; its answer as one
    ``chat.completion`` or, with ``stream: true``, as Server-Sent Events of
    ``chat.completion.chunk`` ending with ``data: [DONE]``. Errors in OpenAI's shape: 400 bad
    or unsupported input (``param`` names the field), 401, 404 ``model_not_found``, 409
    ``chat_busy``, 429 (``Retry-After``), and for a run that did not complete the error of
    :meth:`RunEnd.failure`."""
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        caller = await _authenticate(request)
        chat = chat_request_parse(request.body, chat_id_header=request.headers.get("X-Chat-Id"))
        started, reader = await _start_on_slot(caller, lambda: _start(caller, chat))
    except OpenAIError as exc:
        return exc.response()
    session_id = started.session_id
    completion = Completion(run_id=started.run_id, model=chat.model, chat_id=session_id,
                            structured=chat.response_format is not None)
    tenant_id = caller.membership.tenant_id
    if chat.stream:
        response = StreamingHttpResponse(_streamed(reader, completion, tenant_id, include_usage=chat.include_usage),
                                         content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    else:
        response = await _whole(reader, completion, tenant_id, base_url=request.build_absolute_uri("/"))
    response["X-Chat-Id"] = str(session_id)
    return response


async def _whole(reader: SessionEventReader, completion: Completion, tenant_id: int, *, base_url: str) -> JsonResponse:
    """The non-streamed answer: it ends at the run's end, its pause on the client's tools, or
    its pause for a person's decision (never holding the request until someone decides)."""
    try:
        await reader.open()
        async for item in _run_items(reader, completion.run_id, at_person_pause=True):
            if isinstance(item, RunEnd):
                failure = item.failure()
                if failure is not None:
                    return failure.response()
                usage = await _usage(tenant_id, completion.run_id)
                return JsonResponse(completion.whole(item, usage, base_url=base_url))
            if item is not None:
                completion.gather(item)
    except OpenAIError as exc:
        return exc.response()
    finally:
        await reader.close()
    return OpenAIError(502, "The answer ended early.", type="server_error").response()


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _end_chunks(end: RunEnd, completion: Completion, tenant_id: int, *, include_usage: bool) -> list[str]:
    """The stream's last data lines: the error of a run that did not complete; else the checked
    content of a structured answer, the client's tool calls, the finish chunk, the usage chunk."""
    failure = end.failure()
    if failure is not None:
        return [_sse(failure.body())]
    lines = []
    if completion.structured and end.reply:
        lines.append(_sse(completion.chunk({"content": end.reply})))
    if end.tool_calls:
        lines.append(_sse(completion.tool_calls_chunk(end)))
    lines.append(_sse(completion.chunk({}, finish_reason=end.finish_reason)))
    if include_usage:
        lines.append(_sse(completion.usage_chunk(await _usage(tenant_id, completion.run_id))))
    return lines


async def _streamed(reader: SessionEventReader, completion: Completion, tenant_id: int, *,
                    include_usage: bool) -> AsyncIterator[str]:
    """The SSE text: the role chunk, one chunk per delta, a ``: ping`` comment per keep-alive,
    the finish chunk (or an ``{"error"}`` data line), the usage chunk if asked, ``[DONE]``."""
    try:
        await reader.open()
        yield _sse(completion.chunk({"role": "assistant", "content": ""}))
        async for item in _run_items(reader, completion.run_id):
            if item is None:
                yield ": ping\n\n"
            elif isinstance(item, RunEnd):
                for text in await _end_chunks(item, completion, tenant_id, include_usage=include_usage):
                    yield text
            elif not (completion.structured and "content" in item):
                yield _sse(completion.chunk(item))
    except OpenAIError as exc:
        yield _sse(exc.body())
    finally:
        await reader.close()
    yield "data: [DONE]\n\n"


# --- the Responses API -------------------------------------------------------------------------


@database_sync_to_async
def _start_response(caller: Caller, request: ResponsesRequest) -> tuple[Started, str]:
    """A response's run (:func:`_start_run`; 404 also for a previous response not the caller's):
    a new one, or the run the request's tool outputs resume (a later segment of it), with its
    row (``run``: a stream opens from it without a query); and its agent's slug."""
    resumed: list[Started] = []
    posted: list[Run] = []
    slugs: list[str] = []

    def post(agent: AgentInstance) -> Run:
        slugs.append(agent.slug)
        if not request.tool_outputs:
            posted.append(_post_response(caller, agent, request))
            return posted[0]
        if request.previous_run_id is not None:
            _previous_run(caller, agent, request)
        resumed.append(run_resume_with_outputs(user=caller.user, agent=agent, outputs=request.tool_outputs,
                                               params=request.tool_output_params, outputs_param="input",
                                               run_id=request.previous_run_id))
        return resumed[0].run

    session_id, run_id = _start_run(caller, request.model, post)
    if resumed:
        return resumed[0], slugs[0]
    return Started(session_id=session_id, run_id=run_id, run=posted[0]), slugs[0]


def _previous_run(caller: Caller, agent: AgentInstance, request: ResponsesRequest) -> Run:
    """The run of ``previous_response_id``. Raises OpenAIError 404 when it is not the caller's
    run of ``agent``."""
    previous = run_get_for_user(run_id=request.previous_run_id, user_id=caller.user.pk)
    if previous is None or previous.session.agent_id != agent.pk:
        raise OpenAIError(404, f"No response {request.previous_response_id!r} of `{request.model}` is yours.",
                          param="previous_response_id", code="previous_response_not_found")
    return previous


@transaction.atomic  # the images are attached before the run is handed to a worker (on commit)
def _post_response(caller: Caller, agent: AgentInstance, request: ResponsesRequest) -> Run:
    if request.previous_run_id is None:
        return _with_images(chat_from_conversation(user=caller.user, agent=agent, history=request.history,
                                                   content=request.content, request_options=request.request_options()),
                            request.images)
    previous = _previous_run(caller, agent, request)
    if Run.objects.filter(session_id=previous.session_id, status__in=ACTIVE_RUN_STATUSES).exists():
        raise OpenAIError(409, "This conversation has a run in progress; wait for it to end.", code="chat_busy")
    return _with_images(message_post(session=previous.session, user=caller.user, content=request.content,
                                     request_options=request.request_options()), request.images)


@database_sync_to_async
def _stored_response(tenant_id: int, run_id: int, *, user_id: int, previous_response_id: str | None = None,
                     segment: int = 0, model: str | None = None) -> dict[str, Any] | None:
    """The response object of the caller's run ``run_id`` (its segment ``segment``) as stored,
    or None (not theirs, or no such segment). ``model``: the run's agent's slug, when the caller
    knows it (else read)."""
    with tenant_scope(tenant_id):
        run = run_get_for_user(run_id=run_id, user_id=user_id)
        if run is None:
            return None
        return response_body(run, model=model or run.session.agent.slug, previous_response_id=previous_response_id,
                             segment=segment)


def _response_frames(reader: SessionEventReader, run_id: int) -> AsyncIterator[dict[str, Any] | None]:
    """The session's frames until the run's end or pause (that frame last); ``None`` for a
    keep-alive. Raises OpenAIError 503 when the stream ends first."""
    return _frames_until(reader, lambda frame: ResponseStream.ends(frame, run_id))


@csrf_exempt
async def responses_create(request: HttpRequest) -> HttpResponse:
    """``POST /responses``: a run of the agent ``model``, answered as the response object once
    the run ends or pauses for a person, or with ``stream: true`` as the Responses streaming
    events (:class:`.responses.ResponseStream`). Errors in OpenAI's shape, as for chat
    completions; a run that fails is a response with ``status: failed`` and its ``error``."""
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        caller = await _authenticate(request)
        parsed = responses_request_parse(request.body)
        (started, model), reader = await _start_on_slot(caller, lambda: _start_response(caller, parsed),
                                                        started_of=lambda pair: pair[0])
    except OpenAIError as exc:
        return exc.response()
    ctx = _ResponseContext(reader=reader, run=started.run, model=model, tenant_id=caller.membership.tenant_id,
                           user_id=caller.user.pk, previous_response_id=parsed.previous_response_id,
                           segment=started.segment)
    if parsed.stream:
        response = StreamingHttpResponse(_response_events(ctx), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    return await _response_whole(ctx)


class _ResponseContext:
    """What answering one ``POST /responses`` needs (``run``: the row the request wrote or
    resumed; ``model``: its agent's slug)."""

    def __init__(self, *, reader: SessionEventReader, run: Run, model: str, tenant_id: int, user_id: int,
                 previous_response_id: str | None, segment: int = 0) -> None:
        self.reader, self.run, self.run_id, self.tenant_id, self.user_id = reader, run, run.pk, tenant_id, user_id
        self.model, self.previous_response_id, self.segment = model, previous_response_id, segment

    def opening(self) -> dict[str, Any]:
        """The response a stream opens with (:func:`.responses.response_opening`; no query)."""
        return response_opening(self.run, model=self.model, previous_response_id=self.previous_response_id,
                                segment=self.segment)

    async def stored(self) -> dict[str, Any]:
        found = await _stored_response(self.tenant_id, self.run_id, user_id=self.user_id,
                                       previous_response_id=self.previous_response_id, segment=self.segment,
                                       model=self.model)
        if found is None:  # the chat was deleted meanwhile
            raise OpenAIError(404, "The response's chat was deleted.", code="response_not_found")
        return found


async def _response_whole(ctx: _ResponseContext) -> HttpResponse:
    try:
        await ctx.reader.open()
        async for _frame in _response_frames(ctx.reader, ctx.run_id):
            pass
        return JsonResponse(await ctx.stored())
    except OpenAIError as exc:
        return exc.response()
    finally:
        await ctx.reader.close()


def _sse_event(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def _response_events(ctx: _ResponseContext) -> AsyncIterator[str]:
    """The streaming events: created and in progress, the output as it is made, then
    ``response.completed`` / ``.failed`` / ``.incomplete`` with the stored response (or an
    ``error`` event when the stream ends first)."""
    stream = ResponseStream(run_id=ctx.run_id, segment=ctx.segment)
    try:
        await ctx.reader.open()
        opening = ctx.opening()
        stream.structured = opening["text"]["format"]["type"] != "text"  # kept with the run, also when resumed
        for event in stream.opening(opening):
            yield _sse_event(event)
        async for frame in _response_frames(ctx.reader, ctx.run_id):
            if frame is None:
                yield ": ping\n\n"
                continue
            for event in stream.frame_events(frame):
                yield _sse_event(event)
        for event in stream.final(await ctx.stored()):
            yield _sse_event(event)
    except OpenAIError as exc:
        yield _sse_event(stream.event("error", **exc.body()["error"]))
    finally:
        await ctx.reader.close()


async def _caller_or_error(request: HttpRequest, method: str) -> Caller | HttpResponse:
    if request.method != method:
        return _method_not_allowed(method)
    try:
        return await _authenticate(request)
    except OpenAIError as exc:
        return exc.response()


def _response_not_found(response_id_: str) -> JsonResponse:
    return OpenAIError(404, f"No response {response_id_!r} is yours.", code="response_not_found").response()


@csrf_exempt
async def response_detail(request: HttpRequest, response_id_: str) -> HttpResponse:
    """``GET /responses/<id>``: the caller's response as stored (404 ``response_not_found``
    for another user's or tenant's, or a missing one)."""
    caller = await _caller_or_error(request, "GET")
    if isinstance(caller, HttpResponse):
        return caller
    ref = response_ref_of(response_id_)
    found = None if ref is None else await _stored_response(caller.membership.tenant_id, ref[0],
                                                             user_id=caller.user.pk, segment=ref[1])
    return _response_not_found(response_id_) if found is None else JsonResponse(found)


@database_sync_to_async
def _cancel(caller: Caller, run_id: int, segment: int = 0) -> dict[str, Any] | None:
    with tenant_scope(caller.membership.tenant_id):
        run = run_get_for_user(run_id=run_id, user_id=caller.user.pk)
        if run is None:
            return None
        try:
            run = run_cancel(run=run)
        except ApplicationError as exc:
            raise OpenAIError(exc.status_code, exc.message, code="response_finished") from exc
        return response_body(run, model=run.session.agent.slug, segment=segment)


@csrf_exempt
async def response_cancel(request: HttpRequest, response_id_: str) -> HttpResponse:
    """``POST /responses/<id>/cancel``: cancel the run (a running one stops within about a
    second: the answer may still say ``in_progress``); 409 ``response_finished`` once it ended."""
    caller = await _caller_or_error(request, "POST")
    if isinstance(caller, HttpResponse):
        return caller
    ref = response_ref_of(response_id_)
    try:
        found = None if ref is None else await _cancel(caller, *ref)
    except OpenAIError as exc:
        return exc.response()
    return _response_not_found(response_id_) if found is None else JsonResponse(found)


@csrf_exempt
async def unknown_path(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other path under ``/api/openai/v1/``: 404 in OpenAI's shape (``code`` ``unknown_url``),
    as OpenAI answers ``Invalid URL (<method> <path>)``, not the platform's ``{message, extra}``."""
    return OpenAIError(404, f"Invalid URL ({request.method} {request.path}).", code="unknown_url").response()
