"""An agent's A2A agent card (the a2a-sdk's ``AgentCard``), built per request.

``supportedInterfaces``: JSON-RPC at ``<base>/a2a/<slug>/`` and HTTP+JSON at
``<base>/a2a/<slug>/rest``, each for protocol 1.0 and for 0.3 (the SDK serves the 0.3 methods on
the same endpoints); the 0.3 entries make the SDK add the 0.3 card's ``url``,
``preferredTransport`` and ``additionalInterfaces`` for older clients. One skill (the agent
itself: its name and description); text and JSON in, text out; streaming, push notifications
and an authenticated extended card (:func:`extended_agent_card`) yes. ``securitySchemes``:
``bearer``, the platform's API token, required by every call (the card itself is public only
with the agent's ``a2a_public``). ``capabilities.extensions``: :data:`SIGNED_PUSH_EXTENSION`, which
says where the key set of the push notifications' signatures is (A2A names no place for it;
:mod:`.signing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol

PATH_PREFIX = "/a2a/"
"""Every agent's A2A endpoints are under ``/a2a/<slug>/``."""
REST_SUFFIX = "rest"
"""The HTTP+JSON binding's base, under the agent's prefix."""
SECURITY_SCHEME = "bearer"


def agent_base_url(base_url: str, slug: str) -> str:
    """The agent's JSON-RPC endpoint (its A2A base URL): ``<base>/a2a/<slug>/``."""
    return f"{base_url}{PATH_PREFIX}{slug}/"


SIGNED_PUSH_EXTENSION = "urn:agent-platform:a2a:signed-push-notifications:v1"
"""The card's (optional) extension that describes the push notifications' signature: params
``{jwksUri, alg, header}`` (:mod:`sessions.api.a2a.signing`)."""


def _signed_push_extension(base_url: str) -> AgentExtension:
    from google.protobuf.struct_pb2 import Struct

    from sessions.api.a2a.signing import ALGORITHM, JWKS_PATH, SIGNATURE_HEADER

    params = Struct()
    params.update({"jwksUri": f"{base_url}{JWKS_PATH}", "alg": ALGORITHM, "header": SIGNATURE_HEADER})
    return AgentExtension(
        uri=SIGNED_PUSH_EXTENSION, required=False, params=params,
        description="Push notifications carry a JWT (also as Authorization: Bearer when the config sets none) "
                    "signed with the key set at jwksUri; its request_body_sha256 claim is the body's SHA-256.")


def agent_card(*, base_url: str, slug: str, name: str, description: str, tenant_name: str) -> AgentCard:
    """The card of agent ``slug`` as served at ``base_url`` (``scheme://host``)."""
    jsonrpc_url = agent_base_url(base_url, slug)
    rest_url = f"{jsonrpc_url}{REST_SUFFIX}"
    interfaces = [
        AgentInterface(url=url, protocol_binding=binding, protocol_version=version)
        for version in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)
        for binding, url in ((TransportProtocol.JSONRPC, jsonrpc_url), (TransportProtocol.HTTP_JSON, rest_url))
    ]
    about = description.strip() or f"The {name} agent of {tenant_name}."
    card = AgentCard(
        name=name, description=about, version="1.0", supported_interfaces=interfaces,
        provider=AgentProvider(organization=tenant_name, url=base_url),
        capabilities=AgentCapabilities(streaming=True, push_notifications=True, extended_agent_card=True,
                                       extensions=[_signed_push_extension(base_url)]),
        default_input_modes=["text/plain", "application/json"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id=slug, name=name, description=about, tags=["agent", "chat"],
                           input_modes=["text/plain", "application/json"], output_modes=["text/plain"])],
    )
    card.security_schemes[SECURITY_SCHEME].CopyFrom(SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
        scheme="Bearer", bearer_format="API token",
        description="An API token of the agent's tenant (Settings → API tokens, or POST /api/v1/tokens/).")))
    requirement = SecurityRequirement()
    requirement.schemes[SECURITY_SCHEME].CopyFrom(StringList())
    card.security_requirements.append(requirement)
    return card


@dataclass(frozen=True, slots=True)
class CardTool:
    """One capability an agent is bound to, as the extended card lists it."""

    key: str
    """A stable id within the agent (``<kind>-<binding id>``)."""
    name: str
    kind_label: str
    tools: Sequence[str] = ()
    """The tool names the binding allows (empty: all the capability offers)."""
    asks_approval: bool = False
    """Whether some of its calls wait for a person's approval."""


def extended_agent_card(card: AgentCard, *, version: int | None, tools: Sequence[CardTool],
                        limits: Sequence[str]) -> AgentCard:
    """The authenticated extended card (A2A ``GetExtendedAgentCard``, for callers with a token of
    the agent's tenant): ``card`` (the public one) plus the published configuration's number as
    ``version`` (``"draft"`` before any is published), one skill per bound capability (its tools,
    whether calls may wait for approval) and the agent's limits in the agent skill's
    description."""
    extended = AgentCard()
    extended.CopyFrom(card)
    extended.version = str(version) if version is not None else "draft"
    if limits:
        agent_skill = extended.skills[0]
        agent_skill.description = f"{agent_skill.description}\n\nLimits: {'; '.join(limits)}."
    for tool in tools:
        about = f"{tool.kind_label} {tool.name!r}"
        if tool.tools:
            about += f" (tools: {', '.join(tool.tools)})"
        if tool.asks_approval:
            about += "; some calls wait for a person's approval (the task is then input-required)"
        extended.skills.append(AgentSkill(id=tool.key, name=tool.name, description=about + ".",
                                          tags=["tool", tool.kind_label.lower()]))
    return extended
