"""An agent's slash commands in the chat app (members of the agent's tenant):

- ``GET /api/v1/agents/<id>/commands/``: the tenant's commands bound to the agent and its MCP
  servers' prompts;
- ``POST /api/v1/agents/<id>/commands/<name>/render/`` ``{arguments: {...}}``: the text (and
  files) for the message box;
- ``GET /api/v1/agents/<id>/commands/<name>/complete/?argument=&value=``: completion values.

Another tenant's agent (or an inactive one) is a 404 like a missing one. The work is in
:mod:`agents.commands`.
"""

from __future__ import annotations

import json

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from agent_platform.api_errors import ApplicationError, NotFound
from agents.commands import agent_command_complete, agent_command_render, agent_commands_list
from agents.models import AgentInstance
from agents.selectors import agent_get_active
from tenants.api.mixins import TenantScopedApiView


class CommandArgumentOutSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    required = serializers.BooleanField()


class AgentCommandSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="Typed after /: a tenant command's name, or <server alias>:<prompt name>.")
    title = serializers.CharField(allow_blank=True)
    description = serializers.CharField(allow_blank=True)
    source = serializers.ChoiceField(choices=["tenant", "mcp"])
    server = serializers.CharField(allow_null=True, help_text="mcp: the server's alias.")
    prompt = serializers.CharField(allow_null=True, help_text="mcp: the prompt's name on its server.")
    arguments = CommandArgumentOutSerializer(many=True)


class UnavailableServerSerializer(serializers.Serializer):
    server = serializers.CharField(help_text="The server's alias.")
    error = serializers.CharField()


class AgentCommandListSerializer(serializers.Serializer):
    commands = AgentCommandSerializer(many=True)
    unavailable = UnavailableServerSerializer(many=True, help_text="Servers whose prompts could not be listed.")


class RenderInputSerializer(serializers.Serializer):
    arguments = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False, default=dict,
        help_text="Argument name → value; a tenant command's free text is ARGUMENTS.")


class AttachmentSerializer(serializers.Serializer):
    filename = serializers.CharField()
    mime_type = serializers.CharField()
    data = serializers.CharField(help_text="Base64.")


class RenderedCommandSerializer(serializers.Serializer):
    name = serializers.CharField()
    source = serializers.ChoiceField(choices=["tenant", "mcp"])
    text = serializers.CharField(allow_blank=True, help_text="What the chat app puts into the message box.")
    description = serializers.CharField(allow_blank=True)
    messages = serializers.ListField(child=serializers.DictField(), help_text="mcp: prompts/get's messages.")
    attachments = AttachmentSerializer(many=True, help_text="mcp: images and binary resources to attach.")


class CompletionSerializer(serializers.Serializer):
    values = serializers.ListField(child=serializers.CharField())
    has_more = serializers.BooleanField()


def _agent(agent_id: int) -> AgentInstance:
    agent = agent_get_active(agent_id=agent_id)
    if agent is None:
        raise NotFound("Agent not found.")
    return agent


class AgentCommandListApi(TenantScopedApiView):
    """The agent's slash commands for the caller: its bound tenant commands and the prompts of
    its bound MCP servers (reached with the caller's own OAuth connection where the server
    needs one); servers that could not answer are listed in ``unavailable``."""

    @extend_schema(responses=AgentCommandListSerializer)
    def get(self, request: Request, agent_id: int) -> Response:
        return Response(agent_commands_list(agent=_agent(agent_id), user_id=request.user.pk))


class AgentCommandRenderApi(TenantScopedApiView):
    """One command filled in with its arguments: the text for the message box (a tenant
    command's template; an MCP prompt's ``prompts/get`` messages, with its images and files as
    attachments). 400 names a missing required argument or an unknown one."""

    throttle_scopes = ("search",)

    @extend_schema(request=RenderInputSerializer, responses=RenderedCommandSerializer)
    def post(self, request: Request, agent_id: int, name: str) -> Response:
        data = RenderInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(agent_command_render(agent=_agent(agent_id), user_id=request.user.pk, name=name,
                                             arguments=data.validated_data["arguments"]))


class AgentCommandCompleteApi(TenantScopedApiView):
    """Completion values for an argument of an MCP prompt (``completion/complete``); empty for a
    tenant command and for a server that offers no completions."""

    @extend_schema(
        parameters=[OpenApiParameter("argument", str, required=True, description="The argument's name."),
                    OpenApiParameter("value", str, required=False, description="What was typed so far."),
                    OpenApiParameter("context", str, required=False,
                                     description='The other arguments\' values as a JSON object: {"owner": "acme"}.')],
        responses=CompletionSerializer,
    )
    def get(self, request: Request, agent_id: int, name: str) -> Response:
        argument = request.query_params.get("argument", "")
        if not argument:
            raise ApplicationError("Name the argument to complete: ?argument=<name>&value=<typed so far>.")
        try:
            context = json.loads(request.query_params.get("context") or "{}")
        except ValueError as exc:
            raise ApplicationError("'context' must be a JSON object of argument names to values.") from exc
        return Response(agent_command_complete(
            agent=_agent(agent_id), user_id=request.user.pk, name=name, argument=argument,
            value=request.query_params.get("value", ""), context=context))
