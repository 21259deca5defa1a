"""Call one agent of a running platform through its three doors, with each protocol's own SDK,
as docs/api.md shows, and print what each door answered.

    .venv/bin/python scripts/try_doors.py --token "$(.venv/bin/python manage.py seed_demo --print-token | tail -1)"
    .venv/bin/python scripts/try_doors.py --token … --oauth demo-user:demo-user-pass   # MCP with OAuth too

- the OpenAI-compatible API (``/api/openai/v1``) with the ``openai`` SDK: the models, a chat
  completion, a streamed one with the usage chunk, a response and a streamed response;
- agents over MCP (``/mcp/agents/``) with the ``mcp`` SDK: the tools and a call with progress,
  with the API token; with ``--oauth USER:PASSWORD`` also signed in by OAuth (the SDK's
  ``OAuthClientProvider``; the person's part, signing in on the chat app and allowing on the
  consent page, is done in Chromium by Playwright: ``--chromium`` names the browser);
- A2A (``/a2a/<slug>/``) with the ``a2a-sdk`` client: the card, a streamed message and a
  blocking one.

Exit status 0 when every door answered, 1 otherwise (each failure is printed). It needs the
platform and its model running (``make run``), so it is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import traceback
import uuid
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

QUESTION = "Which port does the web server use? Answer in one sentence."


def _short(text: Any, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the OpenAI-compatible API --


def try_openai(base_url: str, token: str, agent: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/api/openai/v1", api_key=token, timeout=300)
    print("  models:", [m.id for m in client.models.list()])
    answer = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": QUESTION}])
    print("  chat.completions:", _short(answer.choices[0].message.content), "|", answer.choices[0].finish_reason,
          "| usage", answer.usage.total_tokens if answer.usage else None)
    text, usage, reasoning = [], None, 0
    for chunk in client.chat.completions.create(model=agent, stream=True, stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "And the model server?"}]):
        if chunk.usage is not None:
            usage = chunk.usage.total_tokens
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reasoning += bool(getattr(choice.delta, "reasoning_content", None))
    print("  chat.completions, streamed:", _short("".join(text)), f"| {reasoning} reasoning deltas | usage", usage)
    response = client.responses.create(model=agent, input=QUESTION)
    print("  responses:", response.id, response.status, "|", _short(response.output_text))
    events: list[str] = []
    for event in client.responses.create(model=agent, input="And the model server?", stream=True):
        if not events or events[-1] != event.type:
            events.append(event.type)
    print("  responses, streamed:", " → ".join(events))
    print("  responses.retrieve:", client.responses.retrieve(response.id).status)


# -- agents over MCP --


async def _mcp_calls(url: str, agent: str, http: Any) -> None:
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or str(value))

    async with Client(streamable_http_client(url, http_client=http)) as client:
        print("    tools:", [tool.name for tool in (await client.list_tools()).tools])
        answer = await client.call_tool(agent, {"message": QUESTION}, progress_callback=on_progress)
        data = answer.structured_content or {}
        print("    call:", "error" if answer.is_error else data.get("status"), "|",
              _short(data.get("reply") or answer.content[0].text), f"| chat {data.get('chat_id')}",
              f"| {len(progress)} progress notes:", _short(progress, 160))


def try_mcp_with_token(base_url: str, token: str, agent: str) -> None:
    import httpx2

    async def main() -> None:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300))
        async with http:
            await _mcp_calls(f"{base_url}/mcp/agents/", agent, http)

    asyncio.run(main())


class _Callback(BaseHTTPRequestHandler):
    """The loopback redirect URI: keeps the authorization response's query."""

    received: dict[str, str] = {}
    arrived = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).received = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        self.wfile.write(b"Signed in; you may close this window.")
        type(self).arrived.set()

    def log_message(self, *args: Any) -> None:
        return


def _sign_in_and_allow(authorization_url: str, username: str, password: str, chromium: str) -> None:
    """What the person does in the browser: sign in on the chat app, allow on the consent page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        page.goto(authorization_url)
        page.locator("#login-username").fill(username)
        page.locator("#login-password").fill(password)
        page.get_by_test_id("login-submit").click()
        page.get_by_role("button", name="Allow").click()
        _Callback.arrived.wait(60)
        browser.close()


def try_mcp_with_oauth(base_url: str, agent: str, username: str, password: str, chromium: str) -> None:
    import httpx2
    from mcp.client.auth import OAuthClientProvider, TokenStorage
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

    class MemoryStorage(TokenStorage):
        tokens: OAuthToken | None = None
        client_info: OAuthClientInformationFull | None = None

        async def get_tokens(self) -> OAuthToken | None:
            return self.tokens

        async def set_tokens(self, tokens: OAuthToken) -> None:
            self.tokens = tokens

        async def get_client_info(self) -> OAuthClientInformationFull | None:
            return self.client_info

        async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
            self.client_info = client_info

    receiver = HTTPServer(("127.0.0.1", 0), _Callback)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    redirect_uri = f"http://127.0.0.1:{receiver.server_port}/callback"

    async def redirect_handler(authorization_url: str) -> None:
        await asyncio.to_thread(_sign_in_and_allow, authorization_url, username, password, chromium)

    async def callback_handler() -> AuthorizationCodeResult:
        got = _Callback.received
        if "code" not in got:
            raise RuntimeError(f"no authorization code came back: {got}")
        return AuthorizationCodeResult(code=got["code"], state=got.get("state"), iss=got.get("iss"))

    url = f"{base_url}/mcp/agents/"
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(client_name="try_doors.py", redirect_uris=[redirect_uri],
                                            grant_types=["authorization_code", "refresh_token"],
                                            response_types=["code"], token_endpoint_auth_method="none"),
        storage=MemoryStorage(), redirect_handler=redirect_handler, callback_handler=callback_handler,
    )

    async def main() -> None:
        async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30, read=300)) as http:
            await _mcp_calls(url, agent, http)

    try:
        asyncio.run(main())
    finally:
        receiver.shutdown()


# -- A2A --


def try_a2a(base_url: str, token: str, agent: str) -> None:
    import httpx
    from a2a.client import ClientConfig, create_client
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState

    async def main() -> None:
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300)
        async with http:
            for streaming in (True, False):
                client = await create_client(f"{base_url}/a2a/{agent}/",
                                             client_config=ClientConfig(httpx_client=http, streaming=streaming))
                request = SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                                                             parts=[Part(text=QUESTION)]))
                kinds, chunks, task, state = [], [], None, None
                async for event in client.send_message(request):
                    kind = event.WhichOneof("payload")
                    if not kinds or kinds[-1] != kind:
                        kinds.append(kind)
                    if kind == "task":
                        task, state = event.task, event.task.status.state
                    elif kind == "status_update":
                        state = event.status_update.status.state
                    elif kind == "artifact_update":
                        chunks += [p.text for p in event.artifact_update.artifact.parts]
                reply = "".join(chunks) or ("".join(p.text for a in task.artifacts for p in a.parts) if task else "")
                print(f"    send_message (streaming={streaming}):", " → ".join(kinds), "|",
                      TaskState.Name(state) if state is not None else None, "|", _short(reply))
                await client.close()

    asyncio.run(main())


def _door(name: str, call: Callable[[], Awaitable[None] | None]) -> bool:
    print(f"{name}:")
    try:
        call()
    except Exception:  # noqa: BLE001 (a door that fails is reported, and the others still tried)
        print(_short(traceback.format_exc().strip().splitlines()[-1], 500))
        traceback.print_exc(limit=3, file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the platform (default: %(default)s)")
    parser.add_argument("--token", required=True, help="an API token (seed_demo --print-token; chat app Settings)")
    parser.add_argument("--agent", default="assistant", help="the agent's slug (default: %(default)s)")
    parser.add_argument("--oauth", metavar="USER:PASSWORD", help="also connect to MCP by OAuth as this user")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the browser for --oauth")
    args = parser.parse_args(argv)
    base = args.base_url.rstrip("/")
    results = [
        _door("OpenAI-compatible API (openai SDK)", lambda: try_openai(base, args.token, args.agent)),
        _door("MCP with the API token (mcp SDK)", lambda: try_mcp_with_token(base, args.token, args.agent)),
    ]
    if args.oauth:
        username, _, password = args.oauth.partition(":")
        results.append(_door("MCP with OAuth (mcp SDK's OAuthClientProvider)",
                             lambda: try_mcp_with_oauth(base, args.agent, username, password, args.chromium)))
    results.append(_door("A2A (a2a-sdk)", lambda: try_a2a(base, args.token, args.agent)))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
