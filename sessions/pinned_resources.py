"""MCP resources pinned to a chat (issue 37): writes and reads behind
``/api/v1/sessions/<id>/pinned-resources/`` and the pins every new run of the chat carries.

A pin names a bound, enabled MCP server of the chat's agent and an absolute URI (a template's,
filled in), as a resource attached to one message does (:func:`sessions.chat_services.
message_resources`), and is checked the same way without asking the server (a URI the server
does not know becomes a note the model reads). :func:`message_post
<sessions.services.message_post>` adds the chat's pins to each run it creates
(:func:`pinned_resources_for_run`: ``Run.request_options.resources`` items marked ``pinned``);
the run reads them when it starts, through its own pooled sessions (so an ``oauth_user``
server is read with the run's user's connection), keeping the contents of subscribed ones
(:mod:`capabilities.mcp.attached`, :mod:`capabilities.mcp.resources`). A pin whose server is
no longer bound to the agent (or is disabled) stays listed, ``bound: false``, and is left out
of runs.

Every function requires a tenant scope; the caller has checked the chat is the user's own
(:func:`sessions.selectors.chat_session_get_for_user`). Errors are :class:`ApplicationError`.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import JSONField
from django.db.models.expressions import RawSQL

from agent_platform.api_errors import ApplicationError, NotFound
from agents.models import CapabilityBinding
from capabilities.mcp.resources import MAX_URI_CHARS
from sessions.models import ChatSession, PinnedResource, Run

MAX_PINNED_RESOURCES = 10
"""The most resources one chat may have pinned."""

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")
"""An absolute URI (a scheme, a colon, no whitespace), as for attached resources."""


def _bound_servers(*, agent_id: int) -> dict[int, CapabilityBinding]:
    """``{server id: the agent's first enabled binding of it}`` for its enabled MCP servers."""
    bindings = (CapabilityBinding.objects.filter(agent_id=agent_id, kind="mcp_server", enabled=True,
                                                 mcp_server__enabled=True)
                .select_related("mcp_server").order_by("-pk"))
    return {b.mcp_server_id: b for b in bindings}


def pinned_resource_list(*, session: ChatSession) -> list[dict[str, Any]]:
    """The chat's pins, oldest first: ``[{id, server, server_id, binding, uri, bound, updated,
    created_at}]`` (``binding``: the agent's binding of the server, None and ``bound`` false when
    it is no longer bound or enabled; ``updated``: the chat's last run read it again because the
    server said it changed since the run before, :func:`_updated_at_last_run`)."""
    bound = _bound_servers(agent_id=session.agent_id)
    pins = list(PinnedResource.objects.filter(session=session).select_related("mcp_server").order_by("pk"))
    updated = _updated_at_last_run(session=session) if pins else set()
    return [{"id": pin.pk, "server": pin.mcp_server.alias, "server_id": pin.mcp_server_id,
             "binding": bound[pin.mcp_server_id].pk if pin.mcp_server_id in bound else None,
             "uri": pin.uri, "bound": pin.mcp_server_id in bound,
             "updated": (pin.mcp_server.alias, pin.uri) in updated, "created_at": pin.created_at}
            for pin in pins]


def _updated_at_last_run(*, session: ChatSession) -> set[tuple[str, str]]:
    """``{(server alias, uri)}`` of the pinned resources the chat's last run (not superseded, not a
    sub-run) read again because their server said they changed (its start context's
    ``data.resource.updated``, :mod:`capabilities.mcp.attached`). Only the blocks' ``data`` is
    fetched (PostgreSQL ``jsonb_path_query_array``), not their texts."""
    found = (Run.objects.filter(session=session, parent_tool_call__isnull=True, superseded_at__isnull=True,
                                context__isnull=False)
             .order_by("-pk")
             .annotate(resources=RawSQL("jsonb_path_query_array(context, '$[*].data.resource ? (@.updated == true)')",
                                        (), output_field=JSONField()))
             .values_list("resources", flat=True).first())
    return {(str(r.get("server")), str(r.get("uri"))) for r in found or () if isinstance(r, dict)}


def _binding_named(bound: dict[int, CapabilityBinding], *, binding: Any, server: Any) -> CapabilityBinding:
    """The bound binding a pin names (``binding`` id, or ``server``: alias, name or id).

    Raises:
        ApplicationError: 400 naming what was asked for.
    """
    if binding not in (None, ""):
        found = [b for b in bound.values() if str(b.pk) == str(binding)]
        named = f"binding {binding!r}"
    else:
        name = str(server or "").strip()
        found = [b for b in bound.values()
                 if name and name in (b.mcp_server.alias, b.mcp_server.name, str(b.mcp_server_id))]
        named = f"server {name!r}" if name else "no server"
    if not found:
        raise ApplicationError(f"{named[0].upper()}{named[1:]} is not an MCP server of this chat's agent.",
                               extra={"field": "server"})
    return found[0]


@transaction.atomic
def pinned_resource_create(*, session: ChatSession, uri: str, binding: Any = None,
                           server: Any = None) -> tuple[PinnedResource, bool]:
    """Pin ``uri`` of a bound MCP server (``binding`` id, or ``server``: its alias, name or id)
    to the chat; pinning it again returns the existing pin.

    Returns:
        ``(pin, created)``: ``created`` False when it was pinned already.

    Raises:
        ApplicationError: 400: an unknown server, a missing, over-long or relative URI, a
            template's ``{variables}`` left, more than :data:`MAX_PINNED_RESOURCES` pins.
    """
    target = _binding_named(_bound_servers(agent_id=session.agent_id), binding=binding, server=server)
    uri = (uri or "").strip()
    if len(uri) > MAX_URI_CHARS:
        raise ApplicationError(f"The URI is longer than {MAX_URI_CHARS:,} characters.", extra={"field": "uri"})
    if not _URI.match(uri):
        raise ApplicationError(f"{uri[:100]!r} is not an absolute URI.", extra={"field": "uri"})
    if re.search(r"\{[^}]*\}", uri):
        raise ApplicationError(f"Fill in the template's variables in {uri[:100]!r}.", extra={"field": "uri"})
    ChatSession.objects.select_for_update(no_key=True).filter(pk=session.pk).first()  # one pin writer per chat
    existing = PinnedResource.objects.filter(session=session, mcp_server_id=target.mcp_server_id, uri=uri).first()
    if existing is not None:
        return existing, False
    if PinnedResource.objects.filter(session=session).count() >= MAX_PINNED_RESOURCES:
        raise ApplicationError(f"A chat may have at most {MAX_PINNED_RESOURCES} pinned resources; unpin one first.")
    try:
        with transaction.atomic():
            return PinnedResource.objects.create(tenant_id=session.tenant_id, session=session,
                                                 mcp_server_id=target.mcp_server_id, uri=uri), True
    except IntegrityError:  # pragma: no cover - the chat's row lock orders pin writers
        return PinnedResource.objects.get(session=session, mcp_server_id=target.mcp_server_id, uri=uri), False


def pinned_resource_delete(*, session: ChatSession, pin_id: int) -> None:
    """Unpin pin ``pin_id`` of the chat (later runs do not read it).

    Raises:
        NotFound: no such pin in this chat (another chat's, user's or tenant's: the same 404).
    """
    deleted, _ = PinnedResource.objects.filter(session=session, pk=pin_id).delete()
    if not deleted:
        raise NotFound("Pinned resource not found.")


def pinned_resources_for_run(*, session: ChatSession) -> list[dict[str, Any]]:
    """What a new run of the chat carries of its pins (``Run.request_options.resources`` items):
    ``[{binding, server_id, server, uri, pinned: True}]`` of the pins whose server is still
    bound and enabled, oldest first. One query when the chat has no pin.

    Every chat message pays for that query, so it reads three columns rather than the pins' and
    their servers' whole rows (~0.43 against ~0.57 ms of the web process's CPU for a chat without
    pins, measured in-process)."""
    pins = list(PinnedResource.objects.filter(session=session).order_by("pk")
                .values_list("mcp_server_id", "mcp_server__alias", "uri"))
    if not pins:
        return []
    bound = _bound_servers(agent_id=session.agent_id)
    return [{"binding": bound[server_id].pk, "server_id": server_id, "server": alias, "uri": uri, "pinned": True}
            for server_id, alias, uri in pins if server_id in bound]


def with_pinned_resources(request_options: dict[str, Any] | None, pinned: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``request_options`` with ``pinned`` after its attached ``resources`` (a pin also attached
    to the message is read once, as attached)."""
    if not pinned:
        return request_options
    options = dict(request_options or {})
    attached = list(options.get("resources") or ())
    seen = {(r.get("server_id"), r.get("uri")) for r in attached if isinstance(r, dict)}
    options["resources"] = attached + [p for p in pinned if (p["server_id"], p["uri"]) not in seen]
    return options
