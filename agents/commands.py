"""An agent's slash commands, as its chat lists them: the tenant's commands bound to it (kind
``command``) and the prompts of its bound MCP servers (kind ``mcp_server``), both read from
the bindings of the version a new chat of the agent runs (the published one, else the draft).

- :func:`agent_commands_list`: ``[{name, title, description, source, server, prompt,
  arguments}]`` and the servers whose prompts could not be listed;
- :func:`agent_command_render`: one command filled in (a tenant command's template; an MCP
  prompt's ``prompts/get``) as the text (and files) for the message box;
- :func:`agent_command_complete`: completion values for an MCP prompt's argument
  (``completion/complete``); a tenant command completes nothing.

An MCP command is named ``<server alias>:<prompt name>`` (aliases are unique per tenant; a
tenant command's name has no ``:``). MCP requests go to a worker
(:func:`capabilities.commands.requests.mcp_prompts_request`): the web process never connects
to a tenant's server. Requires the tenant's scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_platform.api_errors import ApplicationError, NotFound
from agents.models import AgentInstance, AgentVersion, CapabilityBinding
from agents.versions import version_materialize
from capabilities.commands.kind import KEY as COMMAND_KIND
from capabilities.commands.kind import config_command_id
from capabilities.commands.models import Command
from capabilities.commands.prompt_messages import prompt_messages_render
from capabilities.commands.rendering import CommandArgumentsError, command_arguments, command_render
from capabilities.commands.requests import mcp_prompts_request

MCP_KIND = "mcp_server"
_STATUS_OF_CODE = {"no_worker": 503, "mcp_unavailable": 503, "mcp_connect_error": 503, "timeout": 504}
"""HTTP status of a failed MCP request by its code (others: 502, the server failed)."""


@dataclass(frozen=True, slots=True)
class AgentCommandSources:
    """What an agent's chat offers as commands: its bound commands (by name) and MCP servers
    (``{alias: server id}``)."""

    commands: dict[str, Command]
    servers: dict[str, int]


def agent_chat_bindings(agent: AgentInstance) -> list[CapabilityBinding]:
    """The enabled bindings a new chat run of ``agent`` has: those of its published version
    (materialized: :func:`agents.versions.version_materialize`), or the live rows when it runs
    its draft (never published, or the published version is the draft)."""
    live = list(CapabilityBinding.objects.filter(agent=agent, enabled=True).select_related("mcp_server").order_by("id"))
    version_id = agent.published_version_id
    if version_id is None or version_id == agent.draft_version_id:
        return live
    version = AgentVersion.objects.filter(pk=version_id).first()
    return live if version is None else version_materialize(version, agent, live)[1]


def agent_command_sources(agent: AgentInstance) -> AgentCommandSources:
    """The agent's bound tenant commands and enabled MCP servers (see :func:`agent_chat_bindings`)."""
    bindings = agent_chat_bindings(agent)
    command_ids = [config_command_id(b.config) for b in bindings if b.kind == COMMAND_KIND]
    commands = {c.name: c for c in Command.objects.filter(pk__in=[i for i in command_ids if i])}
    servers = {b.mcp_server.alias: b.mcp_server_id for b in bindings
               if b.kind == MCP_KIND and b.mcp_server_id and b.mcp_server.enabled}
    return AgentCommandSources(commands=commands, servers=servers)


def _tenant_item(command: Command) -> dict[str, Any]:
    return {"name": command.name, "title": "", "description": command.description, "source": "tenant",
            "server": None, "prompt": None, "arguments": command_arguments(command.template, command.arguments)}


def _mcp_item(alias: str, prompt: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"{alias}:{prompt['name']}", "title": prompt.get("title", ""),
            "description": prompt.get("description", ""), "source": "mcp", "server": alias, "prompt": prompt["name"],
            "arguments": prompt.get("arguments", [])}


def agent_commands_list(*, agent: AgentInstance, user_id: int | None) -> dict[str, Any]:
    """The agent's commands for member ``user_id``: ``{commands, unavailable}``.

    ``commands``: the tenant's bound commands (by name), then each MCP server's prompts (by
    alias, in server order), each ``{name, title, description, source: "tenant" | "mcp",
    server, prompt, arguments: [{name, description, required}]}``. ``unavailable``: ``[{server,
    error}]`` for the servers whose prompts could not be listed (unreachable, not connected
    for this person, no worker). One worker round trip when the agent has MCP servers.
    """
    sources = agent_command_sources(agent)
    items = [_tenant_item(c) for _, c in sorted(sources.commands.items())]
    unavailable: list[dict[str, str]] = []
    if sources.servers:
        answer = mcp_prompts_request(tenant_id=agent.tenant_id, user_id=user_id,
                                     request={"op": "list", "servers": sorted(sources.servers.values())})
        if "error" in answer:
            unavailable = [{"server": alias, "error": answer["error"]} for alias in sorted(sources.servers)]
        for row in answer.get("servers", []):
            if row.get("error"):
                unavailable.append({"server": row["alias"], "error": row["error"]})
            items.extend(_mcp_item(row["alias"], p) for p in row.get("prompts", []))
    return {"commands": items, "unavailable": unavailable}


def _mcp_target(sources: AgentCommandSources, name: str) -> tuple[int, str]:
    """``(server id, prompt name)`` of the MCP command ``name`` (``alias:prompt``).

    Raises:
        NotFound: no bound server has that alias.
    """
    alias, _, prompt = name.partition(":")
    server_id = sources.servers.get(alias)
    if server_id is None or not prompt:
        raise NotFound("Command not found.")
    return server_id, prompt


def _mcp_failure(answer: dict[str, Any]) -> ApplicationError:
    """The API error of a failed MCP request: 404 (no such prompt), 400 (its arguments), 503
    (no worker, server unavailable), 504 (timeout), else 502."""
    code = answer.get("code", "")
    if code == "not_found":
        return NotFound("Command not found.")
    if code == "invalid_arguments":
        return ApplicationError(answer["error"], extra={"missing": answer.get("missing", []),
                                                        "unknown": answer.get("unknown", [])})
    return ApplicationError(answer["error"], extra={"code": code}, status_code=_STATUS_OF_CODE.get(code, 502))


def _values(arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, dict):
        raise ApplicationError("'arguments' must be an object of argument names to strings.")
    return arguments


def agent_command_render(*, agent: AgentInstance, user_id: int | None, name: str, arguments: Any) -> dict[str, Any]:
    """The command ``name`` filled in with ``arguments`` (``{name: value}``; a tenant command's
    free text is ``ARGUMENTS``): ``{name, source, text, description, messages, attachments}``.

    ``text`` is what the chat app puts into the message box; for an MCP prompt ``messages`` are
    its ``prompts/get`` messages as JSON and ``attachments`` ``[{filename, mime_type, data}]``
    (base64) its images and binary resources
    (:func:`capabilities.commands.prompt_messages.prompt_messages_render`).

    Raises:
        NotFound: no such command for this agent (404).
        ApplicationError: 400 naming a missing required or an unknown argument; for an MCP
            prompt 502/503/504 when the server or the worker failed.
    """
    values = _values(arguments)
    sources = agent_command_sources(agent)
    command = sources.commands.get(name)
    if command is not None:
        try:
            text = command_render(command.template, command.arguments, values)
        except CommandArgumentsError as exc:
            raise ApplicationError(exc.message, extra={"missing": exc.missing, "unknown": exc.unknown}) from exc
        return {"name": name, "source": "tenant", "text": text, "description": command.description,
                "messages": [], "attachments": []}
    server_id, prompt = _mcp_target(sources, name)
    answer = mcp_prompts_request(tenant_id=agent.tenant_id, user_id=user_id, request={
        "op": "get", "server": server_id, "prompt": prompt, "arguments": values})
    if "error" in answer:
        raise _mcp_failure(answer)
    rendered = prompt_messages_render(answer.get("messages", []), prefix=prompt)
    return {"name": name, "source": "mcp", "text": rendered.text, "description": answer.get("description", ""),
            "messages": answer.get("messages", []), "attachments": rendered.attachments}


def agent_command_complete(*, agent: AgentInstance, user_id: int | None, name: str, argument: str, value: str,
                           context: Any = None) -> dict[str, Any]:
    """Completion values for ``argument`` of the command ``name`` typed so far as ``value``
    (``context``: the other arguments' values): ``{values: [str] (at most 100), has_more}``.
    Empty for a tenant command and for a server without the ``completions`` capability.

    Raises:
        NotFound: no such command (404). ApplicationError: 400 for an argument the command
            does not have or a bad ``context``; 502/503/504 when the server or worker failed.
    """
    context = _values(context or {})
    sources = agent_command_sources(agent)
    command = sources.commands.get(name)
    if command is not None:
        if argument not in {a["name"] for a in command_arguments(command.template, command.arguments)}:
            raise ApplicationError(f"Command /{name} has no argument {argument!r}.")
        return {"values": [], "has_more": False}
    server_id, prompt = _mcp_target(sources, name)
    answer = mcp_prompts_request(tenant_id=agent.tenant_id, user_id=user_id, request={
        "op": "complete", "server": server_id, "prompt": prompt, "argument": argument, "value": value,
        "context": {str(k): str(v) for k, v in context.items()}})
    if "error" in answer:
        raise _mcp_failure(answer)
    return {"values": answer.get("values", []), "has_more": bool(answer.get("has_more"))}
