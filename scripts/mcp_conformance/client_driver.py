"""The platform's MCP client under the official conformance suite's client scenarios
(``@modelcontextprotocol/conformance client``, pinned in package.json beside this file).

The suite starts its test server (and, for ``auth/*`` scenarios, an authorization server) per
scenario and runs ``<command> <server-url>`` with ``MCP_CONFORMANCE_SCENARIO`` (the scenario's
name), ``MCP_CONFORMANCE_CONTEXT`` (JSON: e.g. a pre-registered client) and
``MCP_CONFORMANCE_PROTOCOL_VERSION`` set; it judges the client by what it sent. The command is::

    python scripts/mcp_conformance/client_driver.py <server-url>

What a scenario does (:func:`run_scenario`) is what the platform does, through its own code:

1. The tenant's ``McpServer`` row for the URL (``streamable_http``; ``auth/*`` scenarios:
   ``auth_mode=oauth_user``, a pre-registered client from the context as an admin enters it;
   ``auth/client-credentials-*``: ``oauth_client_credentials`` with the context's client id and
   secret or private key, and no Connect: the run gets the token itself).
2. ``auth/*``: the person's Connect, as the API's connect view and the callback view do it:
   :func:`capabilities.mcp_oauth.services.connection_begin` (discovery from the 401, RFC 9728
   and RFC 8414, client ID metadata document or dynamic registration, PKCE, ``resource``), the
   person's browser (an HTTP GET of the authorization URL: the suite's authorization server
   approves without a person and redirects to our callback URL with ``code``, ``state``,
   ``iss``), then :func:`~capabilities.mcp_oauth.services.connection_complete` (``iss``, the code
   exchange, the tokens stored encrypted).
3. A run's use of the server: the binding's config from
   :func:`capabilities.services.mcp_server_config`, the user's OAuth connection attached by
   :func:`capabilities.mcp_oauth.runs.with_connections` (bearer tokens, refresh, step-up), and
   :class:`capabilities.mcp.client.McpConnection`: handshake (or 2026-07-28 discovery),
   ``tools/list``, a ``tools/call`` of each tool (arguments as a model might send them; a
   server's question to the person, elicitation, is accepted and the call resumed as the
   runner resumes it).
4. A step-up (403 ``insufficient_scope``, or a 401 on any request that a refreshed token gets
   too) marks the connection ``reconnect`` with the scopes asked for; the person connects again (step 2, which asks for the union) and the run retries,
   at most :data:`MAX_CONNECTS` connects in all.

Nothing is imitated: where the platform lacks what a scenario wants, the scenario fails
(scripts/mcp_conformance/expected-client-failures.yml says which and why).

Loading Django costs seconds of CPU per process, too much for a suite of ~50 scenarios run in
parallel; so this script has two modes:

- ``MCP_CLIENT_DRIVER_URL`` set (agent_platform/tests/test_mcp_client_conformance.py): a relay
  of a few milliseconds, standard library only, that posts the scenario to :func:`serve`'s
  loopback endpoint in the test process (the test database, one thread per scenario) and
  prints its log; its exit code is the scenario's.
- Otherwise: Django is set up here (``DJANGO_SETTINGS_MODULE``, the database of
  ``DATABASE_URL``) and the scenario runs in this process as the member
  ``MCP_DRIVER_USER_ID`` of the tenant ``MCP_DRIVER_TENANT_ID``.

Exit code 0: the client did everything it meant to; 1: it stopped with an error (printed).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import urllib.request
from typing import Any

MAX_CONNECTS = 3
"""Connects (the first and a person's reconnects after step-ups) before the driver gives up."""

BASE_URL = "https://agent-platform.example"
"""The platform's public origin as the authorization server sees it: the callback
(``/mcp-oauth/callback/``) and the Client ID Metadata Document are under it. The driver reads the
redirect instead of following it, so it need not resolve."""

MAX_CALLS = 10
"""Tools called per scenario (each listed tool once, in order, as a model might)."""

MAX_INPUT_ROUNDS = 5
"""Rounds of a server's questions to the person (elicitation) per tool call."""

CONCURRENT_SCENARIOS = 3
"""Scenarios :func:`serve` runs at once (the suite starts them all together; each holds up to
two database connections, and the process's pool has ten)."""

SCENARIO_TIMEOUT_SECONDS = 60.0
"""The most one scenario may take in the serving process (the suite's own timeout is 30 s)."""


class Log:
    """What the scenario did, line by line (the relay prints it; the suite saves it)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        self.lines.append(text)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _make_server(*, url: str, scenario: str, context: dict[str, Any], tenant_id: int) -> Any:
    """The tenant's ``McpServer`` for this scenario (as an admin adds it in the console)."""
    import secrets

    from capabilities.models import McpAuthMode, McpServer
    from tenants.crypto import secret_encrypt
    from tenants.models import Tenant
    from tenants.scoping import tenant_scope

    with tenant_scope(tenant_id):
        tenant = Tenant.objects.get(pk=tenant_id)
        oauth = scenario.startswith("auth/")
        client_secret = context.get("client_secret", "") if oauth else ""
        private_key = context.get("private_key_pem", "") if oauth else ""
        mode = McpAuthMode.OAUTH_USER if oauth else McpAuthMode.NONE
        if scenario.startswith("auth/client-credentials"):  # the admin chose the tenant's own client
            mode = McpAuthMode.OAUTH_CLIENT_CREDENTIALS
        return McpServer.objects.create(
            tenant=tenant, name=f"Conformance {scenario}"[:100], alias=f"conf-{secrets.token_hex(6)}",
            transport="streamable_http", url=url, auth_mode=mode,
            oauth_client_id=context.get("client_id", "") if oauth else "",
            oauth_client_secret_encrypted=secret_encrypt(tenant=tenant, plaintext=client_secret) if client_secret
            else "",
            oauth_private_key_encrypted=secret_encrypt(tenant=tenant, plaintext=private_key) if private_key else "",
            connect_timeout_seconds=20, list_timeout_seconds=20, call_timeout_seconds=20,
        )


def _connect(server: Any, user: Any, log: Log) -> None:
    """The person's Connect: the connect view's service, the browser's visit to the
    authorization server, the callback view's service.

    Raises:
        ConnectError: a step failed (the message says which).
    """
    import httpx

    from capabilities.mcp_oauth.services import ConnectError, connection_begin, connection_complete
    from tenants.scoping import tenant_scope

    with tenant_scope(server.tenant_id):
        authorization_url = connection_begin(server=server, user=user, is_admin=False, base_url=BASE_URL,
                                             return_to="/#/settings")
    log(f"authorization URL: {authorization_url}")
    answer = httpx.get(authorization_url, follow_redirects=False, timeout=20)  # the person's browser
    location = answer.headers.get("location", "")
    if answer.status_code not in (301, 302, 303, 307, 308) or not location:
        raise ConnectError(f"the authorization server answered {answer.status_code} without a redirect")
    query = httpx.URL(location).params
    log(f"redirected to the callback with: {sorted(query.keys())}")
    connection = connection_complete(state=query.get("state", ""), code=query.get("code", ""),
                                     iss=query.get("iss"), user=user, error=query.get("error", ""))
    log(f"connected: status {connection.status}, scope {connection.scope!r}")


def _arguments(scenario: str, schema: dict[str, Any], focal: dict[str, Any]) -> dict[str, Any]:
    """Arguments a model might send: a plain value for each required property (strings with a
    non-ASCII letter, as people write them). ``json-schema-2020-12-preservation`` asks the client
    to send another tool's input schema (``focal``) back as the echo tool's ``schema`` argument:
    the schema the platform offers the model (:func:`capabilities.mcp.tool.normalize_input_schema`)."""
    from capabilities.mcp.tool import normalize_input_schema

    samples = {"integer": 1, "number": 1, "boolean": True, "string": "Grüße", "array": [], "object": {}}
    properties = schema.get("properties") or {}
    arguments = {name: samples.get((properties.get(name) or {}).get("type", "string"), "Grüße")
                 for name in schema.get("required") or []}
    if scenario == "json-schema-2020-12-preservation" and "schema" in properties:
        arguments["schema"] = normalize_input_schema(focal)
    return arguments


async def _call(mcp: Any, name: str, arguments: dict[str, Any], log: Log) -> Any:
    """One tool call as a run makes it: when the server asks the person (elicitation:
    ``InputForUser``), the person accepts with a plain value for each field, and the call is
    made again with the answer (:func:`capabilities.mcp.elicitation.resume_arguments`, as the
    runner resumes it), at most :data:`MAX_INPUT_ROUNDS` times.

    Returns:
        The call's ``ToolResult``. Raises what the call raises.
    """
    from capabilities.mcp.elicitation import resume_arguments
    from capabilities.mcp.results import to_tool_result
    from capabilities.tools import InputForUser

    resume = None
    for _ in range(MAX_INPUT_ROUNDS):
        try:
            raw = await mcp.call_tool_raw(name, arguments, timeout_seconds=20, resume=resume)
            return to_tool_result(raw)
        except InputForUser as question:
            log(f"{name} asks the person: {question.request.get('message', '')!r}; they accept")
            content = _arguments("", question.request.get("schema") or {}, {})
            resume = resume_arguments({"request": question.request, "action": "accept", "content": content})
    raise RuntimeError(f"{name} asked the person more than {MAX_INPUT_ROUNDS} times")


async def _use(server: Any, user_id: int, scenario: str, log: Log) -> None:
    """A run's use of the server: its config, the user's OAuth connection, list and call.

    Raises:
        ConnectionRequired: the OAuth connection has to be made (again), e.g. a step-up.
        McpConnectError, ToolError: the MCP server could not be used.
    """
    import contextlib

    from asgiref.sync import sync_to_async
    from django.db import connection as db_connection

    from capabilities.mcp.client import McpConnection
    from capabilities.mcp.kind import McpBindingSpec
    from capabilities.mcp_oauth.runs import with_connections
    from capabilities.registry import OpenContext
    from capabilities.services import mcp_server_config
    from tenants.scoping import tenant_scope

    def in_thread(fn):  # the runner's database thread: the run's tenant scope
        def scoped(**kwargs):
            try:
                with tenant_scope(server.tenant_id):
                    return fn(**kwargs)
            finally:
                db_connection.close()
        return sync_to_async(scoped, thread_sensitive=False)

    config = await in_thread(lambda: mcp_server_config(server=server))()
    spec = McpBindingSpec(server=config, allowed_tools=frozenset(), server_id=server.pk, auth_mode=server.auth_mode)
    async with contextlib.AsyncExitStack() as stack:
        ctx = OpenContext(tenant_id=server.tenant_id, run_id=0, tool_timeout_seconds=20, stack=stack,
                          in_thread=in_thread, user_id=user_id)
        kept = await with_connections([spec], ctx)
        if not kept:
            raise RuntimeError("the run left the server out: it has no usable OAuth connection")
        async with McpConnection(kept[0].server) as mcp:
            tools = await mcp.list_tools()
            log(f"tools: {[tool.name for tool in tools]}")
            for tool in tools[:MAX_CALLS]:
                focal = next((other.input_schema for other in tools if other is not tool), {})
                result = await _call(mcp, tool.name, _arguments(scenario, tool.input_schema, focal), log)
                log(f"called {tool.name}: {result.content[:200]!r}")


def _reconnect_reason(server: Any, user_id: int) -> str:
    """The connection's ``last_error`` when it is marked ``reconnect`` (else '')."""
    from capabilities.mcp_oauth.models import ConnectionStatus, McpOAuthConnection
    from tenants.scoping import tenant_scope

    if server.auth_mode == "none":
        return ""
    with tenant_scope(server.tenant_id):
        connection = McpOAuthConnection.objects.filter(server=server, user_id=user_id).first()
    if connection is None or connection.status != ConnectionStatus.RECONNECT:
        return ""
    return connection.last_error or "reconnect"


def _scenario(*, url: str, scenario: str, context: dict[str, Any], tenant_id: int, user_id: int, log: Log) -> None:
    """Steps 1-4 of the module's docstring. Raises whatever stopped the client."""
    import asyncio

    from django.contrib.auth import get_user_model

    server = _make_server(url=url, scenario=scenario, context=context, tenant_id=tenant_id)
    user = get_user_model().objects.get(pk=user_id)
    connects = 0
    while True:
        if server.auth_mode in ("oauth_user", "oauth_tenant"):  # client credentials: no person connects
            connects += 1
            _connect(server, user, log)
        try:
            asyncio.run(asyncio.wait_for(_use(server, user_id, scenario, log), SCENARIO_TIMEOUT_SECONDS))
            return
        except Exception as exc:
            # What the person sees in Settings: the connection asks to be made again (a step-up,
            # a refused token or refresh); they click Connect. Anything else ends the scenario.
            why = _reconnect_reason(server, user_id)
            if not why or connects >= MAX_CONNECTS:
                raise
            log(f"the run failed ({type(exc).__name__}); the connection asks to connect again: {why}")


def run_scenario(*, url: str, scenario: str, context: dict[str, Any], tenant_id: int, user_id: int) -> tuple[int, str]:
    """Run one scenario against ``url`` as ``user_id`` of ``tenant_id``.

    Returns:
        ``(exit code, log)``: 0 when the client finished, 1 when it stopped with an error
        (the log ends with it). Never raises for the client's failures.
    """
    from django.db import connection as db_connection

    log = Log()
    log(f"scenario {scenario} at {url}")
    try:
        _scenario(url=url, scenario=scenario, context=context, tenant_id=tenant_id, user_id=user_id, log=log)
        return 0, log.text()
    except Exception as exc:  # the client's failure is the scenario's result, reported
        log(f"the client stopped: {type(exc).__name__}: {getattr(exc, 'message', None) or exc}")
        log(traceback.format_exc(limit=8))
        return 1, log.text()
    finally:
        db_connection.close()


def serve(*, tenant_id: int, user_id: int) -> tuple[str, Any]:
    """A loopback HTTP endpoint running :func:`run_scenario` for the relay, a thread per request.

    Returns:
        ``(url, server)``: the URL to put in ``MCP_CLIENT_DRIVER_URL``; ``server.shutdown()``
        and ``server.server_close()`` stop it. Requires Django set up.
    """
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    turns = threading.BoundedSemaphore(CONCURRENT_SCENARIOS)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with turns:
                code, text = run_scenario(url=asked["url"], scenario=asked["scenario"], context=asked["context"],
                                          tenant_id=tenant_id, user_id=user_id)
            body = json.dumps({"exit_code": code, "log": text}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="mcp-client-driver", daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/", server


def main(argv: list[str]) -> int:
    """The suite's command: ``client_driver.py <server-url>``; the exit code is the scenario's."""
    url = argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    relay = os.environ.get("MCP_CLIENT_DRIVER_URL")
    if relay:
        body = json.dumps({"url": url, "scenario": scenario, "context": context}).encode()
        request = urllib.request.Request(relay, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=SCENARIO_TIMEOUT_SECONDS * 2) as answer:
            done = json.load(answer)
        code, text = done["exit_code"], done["log"]
    else:
        import django

        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        django.setup()
        code, text = run_scenario(url=url, scenario=scenario, context=context,
                                  tenant_id=int(os.environ["MCP_DRIVER_TENANT_ID"]),
                                  user_id=int(os.environ["MCP_DRIVER_USER_ID"]))
    sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
