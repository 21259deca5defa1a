"""End-user endpoints of the chat app's chat management (issue 25): search and badges on the
chat list, rename, soft delete and Undo, edit-and-resend, retry/regenerate, a new chat with a
summary, attachments, and the member's own usage.

Every lookup goes through the ``*_for_user`` selectors: another user's (or tenant's) session,
run or artifact is a 404 "… not found.", the same as a missing one.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from agent_platform.api_schema import paginated
from agents.api.views import AgentOutputSerializer
from sessions.api.views import (
    USAGE_PURPOSE_PARAMETER,
    ArtifactSerializer,
    RunSerializer,
    SessionDetailApi,
    SessionDetailSerializer,
    SessionListCreateApi,
    SessionSerializer,
    session_or_404,
    usage_body,
    usage_month,
    usage_purposes,
    usage_schema,
    usd,
)
from sessions.chat_selectors import chat_session_get_deleted_for_user, chat_session_search, session_usage, user_usage
from sessions.chat_services import (
    MAX_ATTACHMENTS_PER_REQUEST,
    attachment_create,
    attachment_max_bytes,
    attachment_reference,
    chat_session_continue_with_summary,
    chat_session_delete,
    chat_session_rename,
    chat_session_restore,
    run_edit_and_resend,
    run_retry,
    session_regenerate,
)
from sessions.selectors import run_get_for_user
from tenants.api.mixins import TenantScopedApiView


class ChatListItemSerializer(SessionSerializer):
    """A chat in the sidebar: the session, plus ``activity`` ("awaiting_approval" | "running"
    | null) for its badge."""

    activity = serializers.SerializerMethodField()

    class Meta(SessionSerializer.Meta):
        fields = [*SessionSerializer.Meta.fields, "activity"]

    def get_activity(self, obj) -> str | None:
        if getattr(obj, "awaits_approval", False):
            return "awaiting_approval"
        if getattr(obj, "is_running", False):
            return "running"
        return None


class ChatListCreateApi(SessionListCreateApi):
    """The caller's chats, most recently active first, paginated (``page``); POST ``{agent}``
    opens one.

    ``?q=`` finds text in titles and messages (case-insensitive, ≤ 200 chars);
    ``?activity=active`` keeps the chats that are running or wait for an approval.
    """

    @extend_schema(
        operation_id="v1_sessions_list",
        parameters=[OpenApiParameter("q", str, required=False, description="Text in the title or the messages."),
                    OpenApiParameter("activity", str, required=False, enum=["active"])],
        responses=paginated("PaginatedChatList", ChatListItemSerializer()),
    )
    def get(self, request: Request) -> Response:
        activity = request.query_params.get("activity", "")
        if activity not in ("", "active"):
            raise ApplicationError("`activity` must be 'active' or left out.")
        qs = chat_session_search(user_id=request.user.pk, query=request.query_params.get("q", ""), activity=activity)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(ChatListItemSerializer(page, many=True).data)


# ChatAgentSerializer and ChatDetailSerializer document ChatDetailApi.get's answer (built
# from SessionDetailApi's); their docstrings are the schema's descriptions.
class ChatAgentSerializer(AgentOutputSerializer):
    """A chat's agent: ``message_mode`` says what happens to a message sent while a run is
    busy (``queue``: answered by its own run afterwards; ``steer``: handed to the running run)."""

    class Meta(AgentOutputSerializer.Meta):
        ref_name = "ChatAgent"
        fields = [*AgentOutputSerializer.Meta.fields, "message_mode"]


class ChatDetailSerializer(SessionDetailSerializer):
    """A chat: the session with its runs (oldest first) and their tool calls, its agent with
    ``message_mode``, and ``usage`` over every LLM call of the chat, superseded answers and
    skills included (``llm_calls``, tokens, ``cost_usd`` a decimal string of USD)."""

    agent = ChatAgentSerializer(read_only=True)
    usage = inline_serializer("ChatUsage", {
        "llm_calls": serializers.IntegerField(), "prompt_tokens": serializers.IntegerField(),
        "completion_tokens": serializers.IntegerField(), "cost_usd": serializers.CharField(),
    })

    class Meta(SessionDetailSerializer.Meta):
        ref_name = "ChatDetail"


class ChatDetailApi(SessionDetailApi):
    """A chat (GET as ``SessionDetailApi``; ``usage`` counts every LLM call of the chat, with
    ``llm_calls``; ``agent.message_mode`` is added);
    PATCH ``{title}`` renames it; DELETE soft-deletes it (204; its active runs are cancelled;
    ``POST …/restore/`` undoes it)."""

    class RenameSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ChatRenameInput"

        title = serializers.CharField(max_length=200, allow_blank=False, trim_whitespace=True)

    @extend_schema(responses=ChatDetailSerializer)
    def get(self, request: Request, session_id: int) -> Response:
        response = super().get(request, session_id)
        session = session_or_404(request, session_id)
        # The chat app labels a message sent during a run "queued" or "steered" by this.
        response.data["agent"] = {**response.data["agent"], "message_mode": session.agent.message_mode}
        totals = session_usage(session_id=session_id)
        response.data["usage"] = {
            "llm_calls": totals["llm_calls"], "prompt_tokens": totals["prompt_tokens"],
            "completion_tokens": totals["completion_tokens"], "cost_usd": usd(totals["cost_usd_micros"]),
        }
        return response

    @extend_schema(request=RenameSerializer, responses=SessionSerializer)
    def patch(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        data = self.RenameSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        session = chat_session_rename(session=session, title=data.validated_data["title"])
        return Response(SessionSerializer(session).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, session_id: int) -> Response:
        chat_session_delete(session=session_or_404(request, session_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ChatRestoreApi(TenantScopedApiView):
    """Undo the deletion of one of the caller's chats (the toast's Undo). 200 with the chat."""

    @extend_schema(request=None, responses=SessionSerializer)
    def post(self, request: Request, session_id: int) -> Response:
        session = chat_session_get_deleted_for_user(session_id=session_id, user_id=request.user.pk)
        if session is None:
            raise NotFound("Session not found.")
        return Response(SessionSerializer(chat_session_restore(session=session)).data)


_RUN_OUT = inline_serializer("ChatRunOutput", {"run": RunSerializer()})


class SessionRegenerateApi(TenantScopedApiView):
    """Answer the chat's last message again: the last answer leaves the chat (truncation) and
    a new run starts. 201 ``{run}``; 409 while a run is active or with no message yet."""

    throttle_scopes = ("messages", "runs")

    @extend_schema(request=None, responses={201: _RUN_OUT})
    def post(self, request: Request, session_id: int) -> Response:
        run = session_regenerate(session=session_or_404(request, session_id), user=request.user)
        return Response({"run": RunSerializer(run).data}, status=status.HTTP_201_CREATED)


def _run_or_404(request: Request, run_id: int):
    run = run_get_for_user(run_id=run_id, user_id=request.user.pk)
    if run is None:
        raise NotFound("Run not found.")
    return run


class RunEditApi(TenantScopedApiView):
    """Edit the message of one of the caller's runs and send it again ``{content}``: that run
    and every later one leave the chat (truncation; no branches). 201 ``{run}`` (the new
    run); 409 while a run is active; 404 for another user's run."""

    throttle_scopes = ("messages", "runs")

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RunEditInput"

        content = serializers.CharField(allow_blank=False, trim_whitespace=True)

    @extend_schema(request=InputSerializer, responses={201: _RUN_OUT})
    def post(self, request: Request, run_id: int) -> Response:
        run = _run_or_404(request, run_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        new = run_edit_and_resend(run=run, user=request.user, content=data.validated_data["content"])
        return Response({"run": RunSerializer(new).data}, status=status.HTTP_201_CREATED)


class RunRetryApi(TenantScopedApiView):
    """Retry the chat's last run (failed, cancelled or completed): it leaves the chat and its
    message is sent again. 201 ``{run}``; 409 if it is not the last run or a run is active."""

    throttle_scopes = ("messages", "runs")

    @extend_schema(request=None, responses={201: _RUN_OUT})
    def post(self, request: Request, run_id: int) -> Response:
        new = run_retry(run=_run_or_404(request, run_id), user=request.user)
        return Response({"run": RunSerializer(new).data}, status=status.HTTP_201_CREATED)


class SessionContinueApi(TenantScopedApiView):
    """Start a new chat with the same agent and a summary of this one (for a chat that no
    longer fits the model). 201 ``{session, draft}``: ``draft`` is the suggested first
    message (the summary), for the user to review and send."""

    @extend_schema(request=None, responses={201: inline_serializer(
        "ChatContinueOutput", {"session": SessionSerializer(), "draft": serializers.CharField()})})
    def post(self, request: Request, session_id: int) -> Response:
        session, draft = chat_session_continue_with_summary(session=session_or_404(request, session_id),
                                                            user=request.user)
        return Response({"session": SessionSerializer(session).data, "draft": draft}, status=status.HTTP_201_CREATED)


class AttachmentUploadApi(TenantScopedApiView):
    """Attach files to one of the caller's chats: multipart ``file`` (repeatable, at most 10
    per request, each at most ``ATTACHMENT_MAX_BYTES``, default 10 MiB). Each is stored as an
    artifact of the session. 201 ``[{...artifact, reference}]``: ``reference`` is the text to
    put in the message (a reference line, and a small text file's content), which is how the
    model is offered the file. 413 for a file over the limit (``extra.max_bytes``), 400 with no
    file or an empty one."""

    parser_classes = [MultiPartParser]
    throttle_scopes = ("messages",)

    @extend_schema(
        request={"multipart/form-data": inline_serializer("AttachmentUpload", {"file": serializers.FileField()})},
        responses={201: inline_serializer("AttachmentOut", {"id": serializers.IntegerField(),
                                                            "reference": serializers.CharField()}, many=True)},
    )
    def post(self, request: Request, session_id: int) -> Response:
        session = session_or_404(request, session_id)
        limit = attachment_max_bytes()
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > limit * MAX_ATTACHMENTS_PER_REQUEST + 1_000_000:
            raise ApplicationError("The upload is too large.", status_code=413, extra={"max_bytes": limit})
        files = request.FILES.getlist("file")
        if not files:
            raise ApplicationError("Send the file(s) in the multipart field `file`.")
        if len(files) > MAX_ATTACHMENTS_PER_REQUEST:
            raise ApplicationError(f"At most {MAX_ATTACHMENTS_PER_REQUEST} files at a time.")
        for f in files:  # check every size before storing any
            if f.size > limit:
                raise ApplicationError(f"“{f.name}” is larger than {limit // (1024 * 1024)} MB.", status_code=413,
                                       extra={"max_bytes": limit, "name": f.name})
        out = []
        for f in files:
            data = f.read(limit + 1)
            artifact = attachment_create(session=session, name=f.name, mime_type=f.content_type or "", data=data)
            out.append({**ArtifactSerializer(artifact).data, "reference": attachment_reference(artifact, data)})
        return Response(out, status=status.HTTP_201_CREATED)


class UsageMeApi(TenantScopedApiView):
    """The caller's own model usage in this workspace for a calendar month (UTC):
    ``?month=YYYY-MM`` (default: this month), ``?purpose=turn,compaction`` (default: every
    purpose; an unknown one is a 400). Any member."""

    @extend_schema(
        parameters=[OpenApiParameter("month", str, description="YYYY-MM, default: this month"),
                    USAGE_PURPOSE_PARAMETER],
        responses=usage_schema("MyUsage"),
    )
    def get(self, request: Request) -> Response:
        start, end = usage_month(request)
        usage = user_usage(user_id=request.user.pk, start=start, end=end, purposes=usage_purposes(request))
        return Response(usage_body(start, usage["total"], usage["by_agent"], by_purpose=usage["by_purpose"]))
