"""An MCP server that asks the user (elicitation), for the elicitation tests: the SDK's
``MCPServer`` over Streamable HTTP on 127.0.0.1 (uvicorn in a daemon thread).

Tools:

- ``book()``: its ``trip`` parameter (``{city: str, days: int = 3}``) is elicited in form mode
  with ``Resolve(Elicit[Trip])``: on 2026-07-28 the call answers ``InputRequiredResult`` and is
  made again with the answer; on 2025-11-25 the server sends ``elicitation/create`` inside the
  call. Returns ``booked <city> for <days> days`` or ``not booked: <decline | cancel>``.
- ``plan()``: asks two questions, one per round (the first answer's retry is asked the
  second): the trip, then ``{nights: int}`` (minimum 1); returns ``<city>, <days> days, <nights> nights``.
- ``connect(account)``: fails with ``-32042`` (URL elicitation required: open
  ``https://auth.example.com/login?next=/files``) the first time it is called for an
  ``account``, then returns ``connected``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import mcp_types
import uvicorn
from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import MCPServer, Resolve
from mcp.server.mcpserver.resolve import Elicit
from mcp.shared.exceptions import UrlElicitationRequiredError
from pydantic import BaseModel, Field

SIGN_IN_URL = "https://auth.example.com/login?next=/files"


class Trip(BaseModel):
    """What ``book`` asks for."""

    city: str
    days: int = 3


async def ask_trip() -> Elicit[Trip]:
    """The resolver of ``book``'s ``trip``: ask the user."""
    return Elicit("Where to, and for how long?", Trip)


class Stay(BaseModel):
    """What ``plan`` asks second."""

    nights: int = Field(ge=1)


async def ask_stay() -> Elicit[Stay]:
    """The resolver of ``plan``'s ``stay``: ask the user."""
    return Elicit("How many nights at the hotel?", Stay)


def travel_server() -> MCPServer:
    """A fresh server (its ``connect`` remembers whether it asked already)."""
    server = MCPServer("travel")
    asked: set[str] = set()

    @server.tool()
    async def book(trip: Annotated[ElicitationResult[Trip], Resolve(ask_trip)]) -> str:
        """Book a trip (asks the user where to)."""
        if isinstance(trip, AcceptedElicitation):
            return f"booked {trip.data.city} for {trip.data.days} days"
        return f"not booked: {trip.action}"

    @server.tool()
    async def plan(trip: Annotated[Trip, Resolve(ask_trip)], stay: Annotated[Stay, Resolve(ask_stay)]) -> str:
        """Plan a trip and a hotel stay (asks the user twice)."""
        return f"{trip.city}, {trip.days} days, {stay.nights} nights"

    @server.tool()
    async def connect(account: str = "") -> str:
        """Connect the user's files (asks them to sign in first)."""
        if account not in asked:
            asked.add(account)
            raise UrlElicitationRequiredError([mcp_types.ElicitRequestURLParams(
                message="Sign in to your files", url=SIGN_IN_URL, elicitation_id="sign-in-1")])
        return "connected"

    return server


@contextmanager
def serve_travel() -> Iterator[str]:
    """Serve :func:`travel_server` on a free port; yields its ``/mcp`` URL."""
    app = travel_server().streamable_http_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="mcp-travel-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
