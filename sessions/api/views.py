"""End-user endpoints: sessions, messages, runs and their activities."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from agent_platform.api_schema import StrictCharField, paginated
from agents.api.views import AgentOutputSerializer
from agents.selectors import agent_get_active
from agents.versions import run_pin
from llm.errors import public_error_message
from llm.metering import LLMCallPurpose
from sessions.api.resources import message_resources
from sessions.models import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Artifact,
    ChatSession,
    LLMCall,
    Run,
    RunStatus,
    ToolCall,
)
from sessions.runs.records import connection_public, elicitation_public, sampling_public
from sessions.selectors import (
    APPROVALS_MINE,
    approval_get_for_user,
    approval_list_pending,
    approval_may_decide,
    artifact_get_for_user,
    artifact_list_for_session,
    chat_session_get_for_user,
    chat_session_list,
    month_bounds,
    run_activities,
    run_get_for_user,
    tenant_usage,
)
from sessions.services import approval_decide, chat_session_create, message_post, run_cancel
from tenants.api.mixins import IsTenantAdmin, TenantScopedApiView


class ToolCallSerializer(serializers.ModelSerializer):
    class Meta:
        model = ToolCall
        fields = [
            "id", "turn", "call_id", "name", "arguments", "status", "result", "result_data", "error",
            "started_at", "finished_at", "duration_ms",
        ]


def usd(micros: int | None) -> str:
    """Micro-USD as a decimal string of dollars (``1234567`` → ``"1.234567"``)."""
    return f"{(micros or 0) / 1_000_000:.6f}"


class LLMCallSerializer(serializers.ModelSerializer):
    """One LLM call. ``purpose`` says what it was for (an ``llm.metering.LLMCallPurpose``
    value: in a run's activities ``turn``, an attempt at a model turn's answer, or
    ``compaction``, the summary of a context compaction made before that turn). ``error`` is
    the provider's (redacted) text for tenant admins (``context["admin"]``) and a plain
    sentence for its error class for everyone else: a provider's error body can quote the
    request or credentials."""

    cost_usd = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()

    class Meta:
        model = LLMCall
        fields = [
            "id", "turn", "purpose", "attempt", "entry_index", "provider_name", "model", "status", "error_class", "error",
            "latency_ms", "first_token_ms", "retry_wait_ms", "prompt_tokens", "completion_tokens", "usage_estimated",
            "cost_usd", "created_at",
        ]

    def get_cost_usd(self, obj: LLMCall) -> str:
        return usd(obj.cost_usd_micros)

    def get_error(self, obj: LLMCall) -> str:
        if not obj.error or self.context.get("admin"):
            return obj.error
        return public_error_message(obj.error_class)


class ApprovalAgentSerializer(serializers.Serializer):
    """The agent whose run waits."""

    id = serializers.IntegerField()
    name = serializers.CharField()


class ApprovalRequesterSerializer(serializers.Serializer):
    """The user whose run waits (the requester)."""

    id = serializers.IntegerField()
    username = serializers.CharField()


class ApprovalApproversSerializer(serializers.Serializer):
    """Who may decide, as resolved when the approval was asked (empty: the run's user)."""

    requester = serializers.BooleanField(required=False, help_text="The run's user may decide.")
    roles = serializers.ListField(child=serializers.CharField(), required=False,
                                  help_text="Members of these roles of the tenant may decide.")
    user_ids = serializers.ListField(child=serializers.IntegerField(), required=False,
                                     help_text="These members may decide.")


class ApprovalSerializer(serializers.ModelSerializer):
    """``run``: the user's run that waits; ``sub_run`` / ``skill``: set when the call is a skill's.

    What a reviewer needs (the inbox, ``?mine=approver``): ``agent``, ``tool_name``,
    ``arguments``, ``reason`` (why approval is needed: the policy rule's ``message``, or the
    tool's reason), ``requester`` (the run's user), ``created_at`` (waiting since),
    ``expires_at`` and ``on_timeout`` (``deny``, ``approve``, or ``""``: the run fails);
    ``approvers`` (who may decide) and ``can_decide`` (whether the caller is one of them).
    ``decided_on_timeout``: decided by its ``on_timeout``, not by a person.

    Kind ``elicitation`` (an MCP server asks the user for input during ``tool_call``): ``mode``
    (``form`` or ``url``), ``message``, ``schema`` (form: the requested JSON Schema, a flat
    object of primitive properties), ``url`` (url mode: the page to open) and ``server`` (the
    MCP server's alias); null for the other kinds.

    Kind ``sampling`` (an MCP server asks to use the agent's model during ``tool_call``; the
    binding's ``sampling.require_approval``): decided approve or deny like a tool call;
    ``server`` and ``message`` are set, and ``sampling`` is ``{server, tool, message, requests:
    [{messages: [{role, text}], system_prompt, max_tokens, offers_tools, tools}]}`` (texts cut);
    null for the other kinds.

    Kind ``connection`` (an OAuth MCP server the run needs has no connected account: the
    model called its ``<alias>__connect`` stand-in, or the server refused the account during
    ``tool_call``): ``server`` is set, and ``connection`` is ``{server, server_id, server_name,
    auth_mode, tool, retry, message}``. Connecting (``POST /api/v1/mcp-connections/<server_id>/connect/``)
    answers it and the run resumes; ``{"decision": "deny"}`` goes on without the server;
    ``{"decision": "approve"}`` says it is connected (a 409 when it is not). Null for the other kinds."""

    skill = serializers.CharField(source="skill_name", read_only=True, allow_null=True)
    agent = serializers.SerializerMethodField()
    requester = serializers.SerializerMethodField()
    approvers = ApprovalApproversSerializer(read_only=True)
    can_decide = serializers.SerializerMethodField()
    decided_on_timeout = serializers.BooleanField(read_only=True)
    mode = serializers.SerializerMethodField()
    message = serializers.SerializerMethodField()
    schema = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    server = serializers.SerializerMethodField()
    sampling = serializers.SerializerMethodField()
    connection = serializers.SerializerMethodField()

    class Meta:
        model = Approval
        fields = [
            "id", "run", "sub_run", "skill", "tool_call", "kind", "status", "tool_name", "arguments", "reason",
            "question", "answer", "decided_by", "decided_at", "expires_at", "created_at",
            "agent", "requester", "approvers", "on_timeout", "can_decide", "decided_on_timeout",
            "mode", "message", "schema", "url", "server", "sampling", "connection",
        ]

    @extend_schema_field(ApprovalAgentSerializer)
    def get_agent(self, obj: Approval) -> dict:
        agent = obj.run.session.agent
        return {"id": agent.pk, "name": agent.name}

    @extend_schema_field(ApprovalRequesterSerializer)
    def get_requester(self, obj: Approval) -> dict:
        return {"id": obj.run.user_id, "username": obj.run.user.get_username()}

    def get_can_decide(self, obj: Approval) -> bool:
        """Whether the caller (``context["user_id"]``, ``context["role"]``) may decide it now."""
        if obj.status != ApprovalStatus.PENDING or obj.kind == ApprovalKind.CLIENT_TOOL:
            return False
        user_id = self.context.get("user_id")
        return user_id is not None and approval_may_decide(obj, user_id=user_id, role=self.context.get("role"))

    @staticmethod
    def _request(obj: Approval) -> dict:
        return (elicitation_public(obj.elicitation) or sampling_public(obj.elicitation)
                or connection_public(obj.elicitation) or {})

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_connection(self, obj: Approval) -> dict | None:
        return connection_public(obj.elicitation)

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_sampling(self, obj: Approval) -> dict | None:
        return sampling_public(obj.elicitation)

    @extend_schema_field(serializers.ChoiceField(choices=["form", "url"], allow_null=True))
    def get_mode(self, obj: Approval) -> str | None:
        return self._request(obj).get("mode")

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_message(self, obj: Approval) -> str | None:
        return self._request(obj).get("message")

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_schema(self, obj: Approval) -> dict | None:
        return self._request(obj).get("schema")

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_url(self, obj: Approval) -> str | None:
        return self._request(obj).get("url") or None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_server(self, obj: Approval) -> str | None:
        return self._request(obj).get("server")


class RunSerializer(serializers.ModelSerializer):
    session = serializers.IntegerField(source="session_id", read_only=True)
    steered_into = serializers.IntegerField(source="steered_into_id", read_only=True, allow_null=True)
    cost_usd = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id", "session", "status", "input", "reply", "structured", "error", "reason", "purpose", "loop_count",
            "attempt",
            "steered_into", "prompt_tokens", "completion_tokens", "cost_usd", "created_at", "started_at", "finished_at",
        ]
        extra_kwargs = {
            "structured": {"help_text": "A completed run with an output format (the agent's output schema or the "
                                        "caller's response_format): its answer as parsed JSON; null otherwise."},
        }

    def get_cost_usd(self, obj: Run) -> str:
        return usd(obj.cost_usd_micros)


class RunWithToolCallsSerializer(RunSerializer):
    """A run with its tool calls, approvals and ``context``: what its bound capabilities added
    to the model input when it started (``[{source, title, text, data}]``, e.g. retrieved
    passages with ``data.citations``; null before it started), and ``attributions``: the
    platform's attribution of an answer that cites none of its passages
    (``[{sentence_start, sentence_end, n, chunk_id, score}]``, offsets in ``reply``; null: not
    attempted)."""

    tool_calls = ToolCallSerializer(many=True, read_only=True)
    approvals = ApprovalSerializer(many=True, read_only=True)

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "tool_calls", "approvals", "context", "attributions"]


class SessionSerializer(serializers.ModelSerializer):
    agent = AgentOutputSerializer(read_only=True)

    class Meta:
        model = ChatSession
        fields = ["id", "agent", "title", "created_at", "updated_at"]


class SessionDetailSerializer(SessionSerializer):
    runs = RunWithToolCallsSerializer(many=True, read_only=True)
    usage = inline_serializer(
        "SessionUsage",
        {"prompt_tokens": serializers.IntegerField(), "completion_tokens": serializers.IntegerField(),
         "cost_usd": serializers.CharField()},
    )

    class Meta(SessionSerializer.Meta):
        fields = [*SessionSerializer.Meta.fields, "runs", "usage"]


def session_or_404(request: Request, session_id: int) -> ChatSession:
    """The caller's own chat session ``session_id`` (in the request's tenant scope).

    Raises:
        NotFound: no such session, or it is another user's or another tenant's (404, never
            403: whether it exists is not told).
    """
    session = chat_session_get_for_user(session_id=session_id, user_id=request.user.pk)
    if session is None:
        raise NotFound("Session not found.")
    return session


class SessionListCreateApi(TenantScopedApiView):
    """The caller's chat sessions; POST ``{agent}`` opens one."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "SessionCreateInput"

        agent = serializers.IntegerField()
        title = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")

    @extend_schema(responses=paginated("PaginatedSessionList", SessionSerializer()))
    def get(self, request: Request) -> Response:
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(chat_session_list(user_id=request.user.pk), request, view=self)
        return paginator.get_paginated_response(SessionSerializer(page, many=True).data)

    @extend_schema(request=InputSerializer, responses={201: SessionSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        agent = agent_get_active(agent_id=data.validated_data["agent"])
        if agent is None:
            raise NotFound("Agent not found.")
        session = chat_session_create(user=request.user, agent=agent, title=data.validated_data["title"])
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailApi(TenantScopedApiView):
    """A session with its runs and their tool calls, oldest run first."""

    @extend_schema(responses=SessionDetailSerializer)
    def get(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        # Sub-runs (skills) are not runs of the conversation: they appear in their parent's
        # activities and at /runs/<id>/; their usage is included in their parent's.
        runs = Run.objects.filter(session=session, parent_tool_call__isnull=True, superseded_at__isnull=True).select_related("user", "session__agent").order_by("created_at", "id").prefetch_related(
            Prefetch("tool_calls", queryset=ToolCall.objects.order_by("turn", "id")),
            Prefetch("approvals", queryset=Approval.objects.select_related("sub_run__skill").order_by("id")),
        )
        data = SessionSerializer(session).data
        data["runs"] = RunWithToolCallsSerializer(runs, many=True, context=_approval_context(request)).data
        data["usage"] = {
            "prompt_tokens": sum(r["prompt_tokens"] for r in data["runs"]),
            "completion_tokens": sum(r["completion_tokens"] for r in data["runs"]),
            "cost_usd": usd(sum(r.cost_usd_micros for r in runs)),
        }
        return Response(data)


class MessagePostApi(TenantScopedApiView):
    """Post a message to a session: creates a queued run. Answer: ``{run: {id, status}}``.

    Throttled per user and per tenant (``API_THROTTLE_RATES`` ``messages.*`` and ``runs.*``):
    429 with ``Retry-After``."""

    throttle_scopes = ("messages", "runs")

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "MessagePostInput"

        content = serializers.CharField(allow_blank=False, trim_whitespace=True)
        resources = serializers.ListField(
            child=serializers.JSONField(), required=False, default=list,
            help_text="MCP resources to attach: [{binding or server, uri}] of the agent's MCP servers (GET "
                      "/api/v1/agents/<id>/resources/), read when the run starts; 400 names a bad item.",
        )
        draft = serializers.BooleanField(
            required=False, default=False,
            help_text="Run the agent's draft (its latest version) rather than its published one: the console's "
                      "playground. Tenant admins only (403 otherwise).",
        )

    @extend_schema(
        request=InputSerializer,
        responses={201: inline_serializer("MessagePostOutput", {"run": RunSerializer()})},
    )
    def post(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        draft = data.validated_data["draft"]
        if draft and not (getattr(request, "membership", None) and request.membership.is_admin):
            raise PermissionDenied("Only tenant owners and admins may run an agent's draft.")
        content, options = data.validated_data["content"], None
        if data.validated_data["resources"]:  # MCP resources attached (sessions.api.resources)
            stored, lines = message_resources(session=session, refs=data.validated_data["resources"])
            content, options = "\n".join([content, *lines]), {"resources": stored}
        with run_pin(draft=draft):
            run = message_post(session=session, user=request.user, content=content, request_options=options)
        return Response({"run": RunSerializer(run).data}, status=status.HTTP_201_CREATED)



def usage_schema(name: str, *, by_user: bool = False) -> Any:
    """The OpenAPI shape of a month's usage answer (tenant's, with ``by_user``, or the caller's own)."""
    rows = serializers.ListField(child=serializers.DictField())
    return inline_serializer(name, {
        "month": serializers.CharField(), "llm_calls": serializers.IntegerField(),
        "prompt_tokens": serializers.IntegerField(), "completion_tokens": serializers.IntegerField(),
        "cost_usd": serializers.CharField(), "by_agent": rows, "by_purpose": rows,
        **({"by_user": rows, "by_run_purpose": rows} if by_user else {}),
    })


def usage_month(request: Request) -> tuple[Any, Any]:
    """``(start, end)`` of the ``?month=YYYY-MM`` asked for (default: this month, UTC).

    Raises:
        ApplicationError: a malformed month (400).
    """
    try:
        return month_bounds(request.query_params.get("month"))
    except ValueError as exc:
        raise ApplicationError(str(exc)) from exc


USAGE_PURPOSE_PARAMETER = OpenApiParameter(
    "purpose", str, many=True, explode=False, enum=LLMCallPurpose.values,
    description=(
        "Only the LLM calls of these purposes (totals and every breakdown): comma-separated, e.g. "
        "`turn,compaction`; repeating the parameter adds to the list. Default: every purpose. "
        "An unknown purpose is a 400."
    ),
)
"""The usage endpoints' ``?purpose=`` filter, as the OpenAPI schema shows it."""


def usage_purposes(request: Request) -> tuple[str, ...] | None:
    """The purposes of ``?purpose=`` (comma-separated, the parameter repeatable; blanks
    ignored), in the order given without repeats, or None when none is given (every purpose).

    Raises:
        ApplicationError: a value that is not an ``LLMCallPurpose`` value (400; ``extra``
        lists the known purposes).
    """
    asked = [p.strip() for raw in request.query_params.getlist("purpose") for p in raw.split(",")]
    asked = [p for p in asked if p]
    if not asked:
        return None
    unknown = [p for p in dict.fromkeys(asked) if p not in LLMCallPurpose.values]
    if unknown:
        raise ApplicationError(
            f"Unknown purpose {', '.join(repr(p) for p in unknown)}: use one or more of "
            f"{', '.join(LLMCallPurpose.values)}, comma-separated.",
            extra={"purposes": list(LLMCallPurpose.values)},
        )
    return tuple(dict.fromkeys(asked))


USAGE_BREAKDOWNS = {"by_agent": ("agent_id", "agent"), "by_user": ("user_id", "user"), "by_purpose": ("purpose",),
                    "by_run_purpose": ("run_purpose",)}
"""The breakdowns a usage answer may have, with the keys that name each row."""


def usage_body(start: Any, total: dict[str, Any], by_agent: list[dict[str, Any]], **breakdowns: Any) -> dict[str, Any]:
    """A month's usage answer: totals, per-agent rows (``agent_id``, ``agent`` and the sums)
    and the other breakdowns given (``by_user``: ``user_id``, ``user``; ``by_purpose``:
    ``purpose``, one of turn, title, memory, query_rewrite, rerank, compaction; ``by_run_purpose``:
    ``run_purpose``, where the calls' run came from: chat, api, evaluation, schedule, webhook or
    null for no run), costs from
    micro-dollars to a USD string. Every LLM call counts, whatever its purpose, purged
    chats' calls included."""
    counts = ("llm_calls", "prompt_tokens", "completion_tokens")
    body = {"month": start.strftime("%Y-%m"), **{k: total[k] for k in counts}, "cost_usd": usd(total["cost_usd_micros"])}
    for name, rows in {"by_agent": by_agent, **breakdowns}.items():
        keys = USAGE_BREAKDOWNS[name]
        body[name] = [{**{k: r[k] for k in keys}, **{k: r[k] for k in counts}, "cost_usd": usd(r["cost_usd_micros"])}
                      for r in rows]
    return body


class UsageApi(TenantScopedApiView):
    """The tenant's model usage for a calendar month (UTC): totals, per agent, per user, per
    purpose (run turns, chat titles, memory, query rewrites, reranks, compactions) and per run
    purpose (the chat app, the API doors, evaluation, schedules, webhooks).

    ``?month=YYYY-MM`` (default: the current month); ``?purpose=turn,compaction`` (default:
    every purpose) counts only those purposes' calls. Owners and admins only.
    """

    permission_classes = [IsTenantAdmin]

    @extend_schema(
        parameters=[OpenApiParameter("month", str, description="YYYY-MM, default: this month"),
                    USAGE_PURPOSE_PARAMETER],
        responses=usage_schema("TenantUsage", by_user=True),
    )
    def get(self, request: Request) -> Response:
        start, end = usage_month(request)
        usage = tenant_usage(start=start, end=end, purposes=usage_purposes(request))
        return Response(usage_body(start, usage["total"], usage["by_agent"], by_user=usage["by_user"],
                                   by_purpose=usage["by_purpose"], by_run_purpose=usage["by_run_purpose"]))


class RunDetailApi(TenantScopedApiView):
    @extend_schema(responses=RunWithToolCallsSerializer)
    def get(self, request: Request, run_id: int) -> Response:
        run = run_get_for_user(run_id=run_id, user_id=request.user.pk)
        if run is None:
            raise NotFound("Run not found.")
        return Response(RunWithToolCallsSerializer(run, context=_approval_context(request)).data)


class RunActivitiesApi(TenantScopedApiView):
    """LLM calls and tool calls of a run in the order they started, paginated.

    Each item: ``{"kind": "llm_call" | "tool_call", "at": datetime, ...fields of the call}``
    (an ``llm_call`` item's ``purpose``: ``turn`` for an attempt at a turn's answer,
    ``compaction`` for a context compaction's summary request), or for a skill's sub-run (started by one of the run's tool calls) ``{"kind": "sub_run", "at",
    "run_id", "tool_call_id", "skill", "depth", "status", "input", "reply", "error", ...}``
    (its own activities: ``/runs/<run_id>/activities/``).
    """

    @extend_schema(responses=paginated("PaginatedActivityList", inline_serializer(
        "Activity", {"kind": serializers.CharField(), "at": serializers.DateTimeField(),
                     "purpose": serializers.ChoiceField(
                         choices=[LLMCallPurpose.TURN.value, LLMCallPurpose.COMPACTION.value], required=False,
                         help_text="llm_call items only: turn (an attempt at a model turn's answer) or "
                                   "compaction (a context compaction's summary request).")})))
    def get(self, request: Request, run_id: int) -> Response:
        run = run_get_for_user(run_id=run_id, user_id=request.user.pk)
        if run is None:
            raise NotFound("Run not found.")
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(run_activities(run=run), request, view=self)
        admin = bool(getattr(request, "membership", None) and request.membership.is_admin)
        return paginator.get_paginated_response([_activity(item, admin=admin) for item in page])


def _activity(item: dict[str, Any], *, admin: bool = False) -> dict[str, Any]:
    if item["kind"] == "sub_run":
        sub = item["object"]
        return {"kind": "sub_run", "at": serializers.DateTimeField().to_representation(item["at"]),
                "run_id": sub.pk, "tool_call_id": sub.parent_tool_call_id, "skill": item["skill"],
                "depth": sub.depth, "status": sub.status, "input": sub.input, "reply": sub.reply,
                "error": sub.error, "reason": sub.reason, "loop_count": sub.loop_count,
                "prompt_tokens": sub.prompt_tokens, "completion_tokens": sub.completion_tokens,
                "cost_usd": usd(sub.cost_usd_micros), "started_at": serializers.DateTimeField().to_representation(sub.started_at) if sub.started_at else None,
                "finished_at": serializers.DateTimeField().to_representation(sub.finished_at) if sub.finished_at else None}
    serializer = LLMCallSerializer if item["kind"] == "llm_call" else ToolCallSerializer
    return {"kind": item["kind"], "at": serializers.DateTimeField().to_representation(item["at"]),
            **serializer(item["object"], context={"admin": admin}).data}


class RunCancelApi(TenantScopedApiView):
    """Cancel a run of the caller's.

    Answers the run: 200 when it was queued and is now ``cancelled``; 202 when it is running
    and its worker was asked to stop (it ends ``cancelled`` within about a second, announced
    by ``run_cancelled``); 404 "Run not found." (missing or not yours); 409 when it has
    already finished.
    """

    @extend_schema(request=None, responses={200: RunSerializer, 202: RunSerializer})
    def post(self, request: Request, run_id: int) -> Response:
        run = run_get_for_user(run_id=run_id, user_id=request.user.pk)
        if run is None:
            raise NotFound("Run not found.")
        run = run_cancel(run=run)
        code = status.HTTP_200_OK if run.status == RunStatus.CANCELLED else status.HTTP_202_ACCEPTED
        return Response(RunSerializer(run).data, status=code)


class ArtifactSerializer(serializers.ModelSerializer):
    class Meta:
        model = Artifact
        fields = ["id", "session", "run", "tool_call", "name", "mime_type", "size_bytes", "created_at"]


class SessionArtifactListApi(TenantScopedApiView):
    """Artifacts of one of the caller's sessions (metadata; bytes at ``/artifacts/<id>/content``)."""

    @extend_schema(responses=ArtifactSerializer(many=True))
    def get(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        return Response(ArtifactSerializer(artifact_list_for_session(session_id=session.pk), many=True).data)


class ArtifactDetailApi(TenantScopedApiView):
    @extend_schema(responses=ArtifactSerializer)
    def get(self, request: Request, artifact_id: int) -> Response:
        artifact = artifact_get_for_user(artifact_id=artifact_id, user_id=request.user.pk)
        if artifact is None:
            raise NotFound("Artifact not found.")
        return Response(ArtifactSerializer(artifact).data)


class ArtifactContentApi(TenantScopedApiView):
    """The artifact's bytes, with its MIME type (served as an attachment unless an image)."""

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request: Request, artifact_id: int) -> HttpResponse:
        artifact = artifact_get_for_user(artifact_id=artifact_id, user_id=request.user.pk)
        if artifact is None:
            raise NotFound("Artifact not found.")
        data = Artifact.objects.values_list("content", flat=True).get(pk=artifact.pk)
        response = HttpResponse(bytes(data), content_type=artifact.mime_type)
        disposition = "inline" if artifact.mime_type.startswith("image/") else "attachment"
        response["Content-Disposition"] = f'{disposition}; filename="{_safe_filename(artifact.name)}"'
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "default-src 'none'; sandbox"
        return response


def _safe_filename(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:100] or "artifact"


def _approval_context(request: Request) -> dict[str, Any]:
    """What :class:`ApprovalSerializer` needs to say whether the caller may decide."""
    membership = getattr(request, "membership", None)
    return {"user_id": request.user.pk, "role": membership.role if membership is not None else None}


class ApprovalListApi(TenantScopedApiView):
    """Pending approvals and questions, oldest first.

    ``?mine=requester`` (the default): those of the caller's own runs, whoever decides them.
    ``?mine=approver``: the caller's inbox, the tool calls waiting for the caller's decision
    (the approval rule names the caller, the caller's role, or the run's user when it is the
    caller's run), across the tenant's runs, also those the caller cannot otherwise see.
    """

    @extend_schema(
        parameters=[OpenApiParameter("mine", str, enum=list(APPROVALS_MINE), required=False,
                                     description="requester (default): of my runs; approver: those I may decide.")],
        responses=ApprovalSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        mine = request.query_params.get("mine") or "requester"
        if mine not in APPROVALS_MINE:
            raise ApplicationError(f"`mine` must be one of {', '.join(APPROVALS_MINE)}.")
        approvals = approval_list_pending(user_id=request.user.pk, mine=mine)
        return Response(ApprovalSerializer(approvals, many=True, context=_approval_context(request)).data)


class ApprovalDecideApi(TenantScopedApiView):
    """Decide a pending approval: of one of the caller's runs, or one the caller is an approver
    of (a reviewer: a role or a member the policy rule names).

    Tool-call approvals: ``{"decision": "approve" | "deny", "reason": "..."}`` (a denial's
    reason goes back to the model), and an MCP server's request to use the agent's model
    (kind ``sampling``) the same way (a denial's reason goes to the server, or to the model
    with the failed call). Questions from ``ask_user``: ``{"answer": "..."}``. An MCP
    server's elicitation: ``{"action": "accept" | "decline" | "cancel", "content": {...}}``
    (form mode: ``content`` is checked against the requested schema; a 400 names the field).
    Once the run has no pending approval left it resumes on any worker. 400 for a bad body,
    403 when the caller sees the approval (their own run) but is not one of its approvers,
    404 when the approval is neither the caller's nor one they may decide (or of another
    tenant), 409 when already decided, expired, or the run has ended. The decision, the
    decider and the reason are in the audit log and the run's trace.
    """

    throttle_scopes = ("runs",)  # a decision resumes the run (API_THROTTLE_RATES runs.*)

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ApprovalDecideInput"

        decision = serializers.ChoiceField(choices=["approve", "deny"], required=False)
        reason = StrictCharField(required=False, allow_blank=True, max_length=2000)
        answer = StrictCharField(required=False, allow_blank=True, max_length=10_000)
        action = serializers.ChoiceField(choices=["accept", "decline", "cancel"], required=False)
        content = serializers.JSONField(required=False)

        def validate(self, attrs: dict) -> dict:
            """Exactly one of ``decision`` (tool calls), ``answer`` (questions) and ``action``
            (elicitations)."""
            if sum(key in attrs for key in ("decision", "answer", "action")) != 1:
                raise serializers.ValidationError("Send exactly one of decision (a tool call), answer (a question) "
                                                  "or action (an MCP server's request for input).")
            return attrs

    @extend_schema(request=None, responses=ApprovalSerializer)
    def get(self, request: Request, approval_id: int) -> Response:
        approval = approval_get_for_user(approval_id=approval_id, user_id=request.user.pk)
        if approval is None:
            raise NotFound("Approval not found.")
        return Response(ApprovalSerializer(approval, context=_approval_context(request)).data)

    @extend_schema(request=InputSerializer, responses=ApprovalSerializer)
    def post(self, request: Request, approval_id: int) -> Response:
        approval = approval_get_for_user(approval_id=approval_id, user_id=request.user.pk)
        if approval is None:
            raise NotFound("Approval not found.")
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        approval = approval_decide(approval=approval, user=request.user, **data.validated_data)
        return Response(ApprovalSerializer(approval, context=_approval_context(request)).data)
