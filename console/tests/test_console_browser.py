"""The console as a tenant admin uses it, in Debian's Chromium (Playwright) against the real
ASGI app: the run trace, the dashboard, the playground and the setup helpers; axe-core on
each page. ``CONSOLE_SCREENSHOTS_DIR=docs`` makes the trace (with an MCP server's log),
dashboard and playground tests write the docs' screenshots (scripts/console_screenshots.sh)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import agent_with_route, bind_builtin
from console.tests.browser import CHROMIUM, check_axe, log_in, open_page, screenshot
from llm.models import ModelRouteEntry
from llm.testing import Fail, Reply, ToolCalls
from sessions.models import Approval, ChatSession, LLMCall, Run
from sessions.runner.loop import execute_run
from sessions.services import approval_decide
from sessions.tests.conftest import post_message_sync
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(autouse=True)
def _needs_chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def _traced_run(world, fake_llm, second_fake_llm) -> Run:
    """A run that fell back from entry 1 to entry 2, asked for test_echo, waited for the
    member's approval, then answered."""
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url, second_fake_llm.base_url],
                             name="Support assistant", system_prompt="You help customers. Be brief.")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_echo", "action": "ask"}])
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(input_price_per_mtok=3, output_price_per_mtok=15)
    fake_llm.script(Fail(503, body={"error": {"message": "overloaded, try later"}}),
                    Reply("The echo tool says: refund #4521 approved. Anything else?", chunk_size=6))
    second_fake_llm.script(ToolCalls([("test_echo", {"text": "refund #4521 approved"})]))
    run = post_message_sync(agent=agent, user=world.member, content="Please check refund #4521 with the echo tool")
    asyncio.run(execute_run(run.pk))
    approval = Approval.all_tenants.get(run_id=run.pk)
    with tenant_scope(world.tenant.pk):
        approval_decide(approval=approval, user=world.member, decision="approve")
    asyncio.run(execute_run(run.pk))
    run = Run.all_tenants.get(pk=run.pk)
    assert run.status == "completed", run.error
    return run


@pytest.mark.usefixtures("no_enqueue")
def test_admin_finds_a_run_and_reads_its_trace_and_transcript(world, other_world, fake_llm, second_fake_llm,
                                                               live_server_url):
    from playwright.sync_api import expect

    run = _traced_run(world, fake_llm, second_fake_llm)
    with open_page() as page:
        log_in(page, live_server_url, world.admin.username)
        page.locator('#content-main a[href$="/admin/agent_sessions/run/"]').first.click()
        page.locator("#searchbar").fill("refund #4521")
        page.get_by_role("button", name="Search").click()
        page.get_by_role("link", name=f"Run {run.pk} — trace").click()

        trace = page.get_by_test_id("run-trace")
        expect(trace).to_have_attribute("data-run-status", "completed")
        expect(page.get_by_test_id("trace-turn")).to_have_count(2)
        expect(page.get_by_test_id("trace-fallback")).to_have_count(1)
        first_attempt = page.get_by_test_id("trace-attempt").first
        expect(first_attempt).to_have_attribute("data-error-class", "overloaded")
        expect(first_attempt).to_contain_text("model-0")
        tool = page.get_by_test_id("trace-tool-call")
        expect(tool).to_have_attribute("data-tool-name", "test_echo")
        expect(tool).to_contain_text('"text": "refund #4521 approved"')
        expect(page.get_by_test_id("trace-approval")).to_contain_text(f"approved by {world.member.username}")
        expect(page.get_by_test_id("trace-reply")).to_have_text("The echo tool says: refund #4521 approved. Anything else?")
        # The prompt of the first turn, behind its fold.
        prompt = page.get_by_test_id("trace-prompt").first
        prompt.locator("summary").click()
        expect(prompt).to_contain_text("Please check refund #4521 with the echo tool")
        check_axe(page, "run trace")
        screenshot(page, "console-trace.png", full_page=True)

        page.get_by_test_id("trace-transcript-link").click()
        expect(page.get_by_test_id("session-transcript")).to_contain_text("Please check refund #4521")
        check_axe(page, "session transcript")
        page.get_by_test_id("transcript-trace-link").first.click()
        expect(page.get_by_test_id("run-trace")).to_have_attribute("data-run-id", str(run.pk))

    # Another tenant's admin finds nothing and is refused the trace.
    with open_page() as page:
        log_in(page, live_server_url, other_world.admin.username)
        page.goto(live_server_url + "/admin/agent_sessions/run/")
        expect(page.locator("#result_list")).to_have_count(0)
        response = page.goto(live_server_url + f"/admin/agent_sessions/run/{run.pk}/trace/")
        assert response.status == 404


def _usage_rows(world, agent, users, days_back: int) -> None:
    """``days_back`` days of runs for each of ``users``, all in the current month whatever the
    date: a day before the month's first is the first (so the 1st of a month has every row)."""
    now = timezone.localtime()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for i in range(days_back):
        day = max(now - timedelta(days=i), month_start + timedelta(minutes=i))
        for j, user in enumerate(users):
            failed = (i + j) % 4 == 0
            cost = 40_000 + 13_000 * ((i * 7 + j * 3) % 9)
            session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=user, title=f"chat {i}")
            run = Run.all_tenants.create(
                tenant=world.tenant, session=session, user=user, input="q", status="failed" if failed else "completed",
                reason=("model_unavailable" if i % 3 else "run_timeout") if failed else "",
                prompt_tokens=900 + 40 * i, completion_tokens=200 + 10 * j, cost_usd_micros=cost,
            )
            LLMCall.all_tenants.create(tenant=world.tenant, run=run, turn=0, agent=agent, user=user, attempt=1,
                                       entry_index=0, provider_name="p", model="m", status="succeeded",
                                       prompt_tokens=900 + 40 * i, completion_tokens=200 + 10 * j, cost_usd_micros=cost)
            Run.all_tenants.filter(pk=run.pk).update(created_at=day)
            LLMCall.all_tenants.filter(run=run).update(created_at=day)


def _open_breaker(entry_id: int, error_class: str) -> None:
    import redis.asyncio as aioredis
    from django.conf import settings

    from llm.health import RedisEntryHealth
    from llm.selectors import entry_health_key

    async def record():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            health = RedisEntryHealth(client, prefix=f"{settings.REDIS_KEY_PREFIX}:health")
            await health.record_failure(entry_health_key(entry_id), error_class, retry_after_seconds=120)
        finally:
            await client.aclose()

    asyncio.run(record())


def test_admin_reads_the_dashboard_for_a_month(world, other_world, live_server_url):
    from playwright.sync_api import expect

    support = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Support assistant")
    research = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Research helper")
    secret = agent_with_route(tenant=other_world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Globex secret agent")
    _usage_rows(world, support, [world.member, world.admin], 20)
    _usage_rows(world, research, [world.member], 9)
    _usage_rows(other_world, secret, [other_world.member], 5)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=support, user=world.member)
    active = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="still going",
                                    status="running")
    ours = Run.all_tenants.filter(tenant=world.tenant, created_at__month=timezone.now().month,
                                  parent_tool_call__isnull=True).count()
    last_month = (timezone.now().replace(day=1) - timedelta(days=1)).strftime("%Y-%m")
    _open_breaker(support.route.entries.get().pk, "rate_limit")

    with open_page(height=1500) as page:
        log_in(page, live_server_url, world.admin.username)
        dashboard = page.get_by_test_id("dashboard")
        expect(dashboard).to_be_visible()
        expect(page.get_by_test_id("kpi-runs")).to_have_text(str(ours))
        expect(page.get_by_test_id("chart-cost").locator("rect.bar").first).to_be_attached()
        expect(page.get_by_test_id("dashboard-agents")).to_contain_text("Support assistant")
        expect(page.get_by_test_id("dashboard-agents")).to_contain_text("Research helper")
        expect(page.get_by_test_id("dashboard-failures")).to_contain_text("Every route entry failed")
        expect(page.get_by_test_id("dashboard-active")).to_contain_text(f"Run {active.pk}")
        expect(page.get_by_test_id("cooling-entry")).to_contain_text("Cooling down after failures")
        expect(page.get_by_test_id("cooling-entry")).to_contain_text("last error: rate_limit")
        expect(dashboard).not_to_contain_text("Globex")
        check_axe(page, "console home")
        screenshot(page, "console-dashboard.png", clip={"x": 0, "y": 0, "width": 1280, "height": 1180})

        # Another month: nothing was run then.
        page.get_by_test_id("dashboard-month").fill(last_month)
        page.get_by_test_id("dashboard-show").click()
        expect(page.get_by_test_id("kpi-runs")).to_have_text("0")
        expect(page.get_by_test_id("dashboard-agents")).to_contain_text("No runs or model calls this month.")
        # The active run's link opens its trace.
        page.get_by_test_id("dashboard-active").get_by_role("link", name=f"Run {active.pk}").click()
        expect(page.get_by_test_id("run-trace")).to_have_attribute("data-run-status", "running")


def test_admin_tries_an_agent_in_the_playground(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Support assistant",
                             system_prompt="You help customers.")
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(input_price_per_mtok=3, output_price_per_mtok=15)
    bind_builtin(agent, "test_echo")
    fake_llm.script(
        ToolCalls([("test_echo", {"text": "order 981 shipped"})]),
        Reply("Your order 981 has shipped and should arrive on Friday.", chunk_size=5),
    )
    with open_page(width=1440, height=1100) as page:
        log_in(page, live_server_url, world.admin.username)
        page.locator('#content-main a[href$="/admin/agents/agentinstance/"]').first.click()
        page.locator("#searchbar").fill("Support")
        page.get_by_role("button", name="Search").click()
        page.get_by_role("link", name="Support assistant").click()
        check_axe(page, "agent page")
        page.get_by_test_id("try-agent").click()
        page.console_errors.clear()  # axe itself trips the CSP (it styles probes inline)

        page.get_by_test_id("playground-input").fill("Where is my order 981?")
        page.get_by_test_id("playground-input").press("Enter")
        expect(page.get_by_test_id("playground-user")).to_have_text("Where is my order 981?")
        reply = page.get_by_test_id("playground-assistant").last
        expect(reply).to_have_text("Your order 981 has shipped and should arrive on Friday.", timeout=30_000)
        expect(reply).to_have_attribute("data-run-status", "completed")
        trace = page.get_by_test_id("playground-trace")
        expect(trace.get_by_test_id("run-trace")).to_have_attribute("data-run-status", "completed", timeout=10_000)
        expect(trace.get_by_test_id("trace-tool-call")).to_contain_text("order 981 shipped")
        expect(trace.get_by_test_id("trace-reply")).to_contain_text("Your order 981 has shipped")
        assert not [e for e in page.console_errors if "Content Security Policy" in e], page.console_errors
        check_axe(page, "playground")
        screenshot(page, "console-playground.png")
    session = ChatSession.all_tenants.get(agent=agent)
    assert session.user_id == world.admin.pk  # the admin's own session, through their membership


def test_the_playground_form_is_disabled_until_its_script_runs(world, live_server_url):
    """A message typed before the deferred script attached its handlers went nowhere (Enter
    put a newline in the box; CI caught it once): the form is rendered disabled and the script
    enables it, so a user (or Playwright's ``fill``) waits for a form that works."""
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Slow page agent")
    url = live_server_url + f"/admin/agents/agentinstance/{agent.pk}/playground/"
    with open_page() as page:
        log_in(page, live_server_url, world.admin.username)
        page.route("**/console/playground.js*", lambda route: route.abort())
        page.goto(url)
        for test_id in ("playground-input", "playground-send", "playground-new"):
            expect(page.get_by_test_id(test_id)).to_be_disabled()
        page.unroute("**/console/playground.js*")
        page.goto(url)
        for test_id in ("playground-input", "playground-send", "playground-new"):
            expect(page.get_by_test_id(test_id)).to_be_enabled()


def test_admin_binds_tools_with_the_setup_helpers(world, other_world, live_server_url):
    from playwright.sync_api import expect

    from capabilities.models import McpServer

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Ops agent")
    McpServer.all_tenants.create(
        tenant=world.tenant, name="tickets", alias="tickets", transport="streamable_http",
        url="https://mcp.example.com/mcp",
        tools_snapshot=[{"name": "list_tickets", "description": "List open tickets", "input_schema": {}},
                        {"name": "close_ticket", "description": "Close a ticket", "input_schema": {}}],
    )
    McpServer.all_tenants.create(
        tenant=other_world.tenant, name="their-server", alias="theirs", transport="streamable_http",
        url="https://mcp.example.com/mcp", tools_snapshot=[{"name": "steal_secrets", "input_schema": {}}],
    )
    with open_page(height=1200) as page:
        log_in(page, live_server_url, world.admin.username)
        # A built-in tool on the agent page: only its fields show; the tool comes from a list.
        page.goto(live_server_url + f"/admin/agents/agentinstance/{agent.pk}/change/")
        page.get_by_role("button", name="Add another Capability binding").click()
        form = page.locator("#bindings-0")
        form.get_by_label("Kind").select_option(label="Built-in tool")
        expect(form.get_by_label("Built-in tool")).to_be_visible()
        expect(form.get_by_label("Mcp server")).to_be_hidden()
        expect(form.get_by_label("Allowed tools")).to_be_hidden()
        form.get_by_label("Built-in tool").select_option("todo_write")
        form.get_by_label("Rule 1: tool name pattern").fill("todo_*")
        form.get_by_label("Rule 1: action").select_option("deny")
        form.get_by_role("button", name="Add a rule").click()
        form.get_by_label("Rule 3: tool name pattern").fill("*")
        form.get_by_label("Rule 3: action").select_option("allow")
        check_axe(page, "agent page with a binding form")
        page.get_by_role("button", name="Save and continue editing").click()
        expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
        saved = page.locator("#bindings-0")
        expect(saved.get_by_label("Built-in tool")).to_have_value("todo_write")
        expect(saved.get_by_label("Rule 1: tool name pattern")).to_have_value("todo_*")
        expect(saved.get_by_label("Rule 2: tool name pattern")).to_have_value("*")

        # An MCP binding on the binding page: the server's tools are ticked from its list.
        page.goto(live_server_url + "/admin/agents/capabilitybinding/add/")
        page.get_by_label("Agent").select_option(label="Ops agent")
        page.get_by_label("Kind").select_option(label="MCP server")
        expect(page.get_by_label("Built-in tool")).to_be_hidden()
        options = page.get_by_label("Mcp server").locator("option").all_inner_texts()
        assert "their-server" not in " ".join(options)
        page.get_by_label("Mcp server").select_option(label="tickets")
        picker = page.get_by_test_id("tool-picker")
        expect(picker).to_contain_text("list_tickets")
        expect(page.locator("body")).not_to_contain_text("steal_secrets")
        picker.get_by_label("list_tickets — List open tickets").check()
        expect(page.get_by_role("textbox", name="Allowed tools")).to_have_value("list_tickets")
        check_axe(page, "binding page")
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator(".messagelist")).to_contain_text("was added successfully")

    binding = CapabilityBinding.all_tenants.get(agent=agent, kind="builtin")
    assert binding.builtin_name == "todo_write"
    assert binding.approval_policy == [{"pattern": "todo_*", "action": "deny"}, {"pattern": "*", "action": "allow"}]
    mcp_binding = CapabilityBinding.all_tenants.get(agent=agent, kind="mcp_server")
    assert mcp_binding.allowed_tools == ["list_tickets"] and mcp_binding.mcp_server.name == "tickets"


def test_admin_tests_a_provider_and_a_route_and_picks_a_listed_model(world, fake_llm, live_server_url):
    from playwright.sync_api import expect

    from llm.testing import Reply

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Routed agent")
    route, provider = agent.route, agent.route.entries.get().provider
    fake_llm.script(Reply("pong"))
    with open_page(height=1300) as page:
        log_in(page, live_server_url, world.admin.username)
        page.goto(live_server_url + f"/admin/llm/modelprovider/{provider.pk}/change/")
        page.get_by_test_id("provider-test").click()
        expect(page.locator(".messagelist")).to_contain_text("answered in")
        expect(page.locator(".messagelist")).to_contain_text(fake_llm.model)

        page.goto(live_server_url + f"/admin/llm/modelroute/{route.pk}/change/")
        expect(page.locator(".field-entry_health")).to_contain_text("Working normally")
        expect(page.get_by_test_id("models-note")).to_contain_text("1 models from the provider")
        model = page.locator('input[name="entries-0-model"]')
        list_id = model.get_attribute("list")
        assert page.locator(f"datalist#{list_id} option").evaluate_all("os => os.map(o => o.value)") == [fake_llm.model]
        model.fill(fake_llm.model)
        check_axe(page, "route page")
        page.get_by_test_id("route-test").click()
        expect(page.locator(".messagelist")).to_contain_text("OK in")


def test_admin_approves_a_tool_call_in_the_playground(world, fake_llm, celery_worker, live_server_url):
    from playwright.sync_api import expect

    import sessions.tests.tools_for_tests  # noqa: F401  (test_echo)

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Careful agent")
    bind_builtin(agent, "test_echo", approval_policy=[{"pattern": "test_echo", "action": "ask"}])
    fake_llm.script(ToolCalls([("test_echo", {"text": "delete nothing"})]), Reply("Done, nothing deleted."))
    with open_page() as page:
        log_in(page, live_server_url, world.admin.username)
        page.goto(live_server_url + f"/admin/agents/agentinstance/{agent.pk}/change/")
        page.get_by_test_id("try-agent").click()
        page.get_by_test_id("playground-input").fill("Please clean up")
        page.get_by_test_id("playground-send").click()
        approval = page.get_by_test_id("playground-approval")
        expect(approval).to_contain_text('Approve test_echo {"text":"delete nothing"}?', timeout=20_000)
        expect(page.get_by_test_id("playground-trace").get_by_test_id("run-trace")).to_have_attribute(
            "data-run-status", "awaiting_approval", timeout=10_000)
        approval.get_by_test_id("playground-approve").click()
        expect(page.get_by_test_id("playground-assistant").last).to_have_text("Done, nothing deleted.", timeout=20_000)
        expect(page.get_by_test_id("playground-trace").get_by_test_id("trace-approval")).to_contain_text(
            f"approved by {world.admin.username}", timeout=10_000)


def test_admin_reads_an_mcp_servers_log_messages_in_the_trace(world, fake_llm, celery_worker, live_server_url):
    """A run (the playground's, on the Celery worker) calls an MCP tool that logs at four levels;
    the binding keeps ``info`` and above, and the run's trace lists those three, with their
    level, logger and data, under the tool call."""
    from playwright.sync_api import expect

    from capabilities.services import mcp_server_save
    from capabilities.tests.prog_test_server import serve_prog

    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Ops agent")
    fake_llm.script(ToolCalls([("prog__chatty", {})]), Reply("The server logged a warning and an error."))
    with serve_prog() as (url, _state):
        server = mcp_server_save(tenant=world.tenant, env=None, name="prog", alias="prog",
                                 transport="streamable_http", url=url)
        binding = CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.MCP_SERVER, mcp_server=server,
                                    config={"log_level": "info"})
        binding.full_clean()
        binding.save()
        with open_page(width=1280, height=1000) as page:
            log_in(page, live_server_url, world.admin.username)
            page.goto(live_server_url + f"/admin/agents/agentinstance/{agent.pk}/change/")
            page.get_by_test_id("try-agent").click()
            page.get_by_test_id("playground-input").fill("Check the server")
            page.get_by_test_id("playground-send").click()
            expect(page.get_by_test_id("playground-assistant").last).to_have_text(
                "The server logged a warning and an error.", timeout=20_000)
            run_trace = page.get_by_test_id("playground-trace").get_by_test_id("run-trace")
            expect(run_trace).to_have_attribute("data-run-status", "completed", timeout=10_000)
            run_id = run_trace.get_attribute("data-run-id")

            page.goto(live_server_url + f"/admin/agent_sessions/run/{run_id}/trace/")
            tool = page.locator('[data-testid="trace-tool-call"][data-tool-name="prog__chatty"]')
            log = tool.get_by_test_id("trace-server-log")
            expect(log.locator("summary")).to_have_text("Server log (3 messages)")  # debug is below info
            log.locator("summary").click()
            entries = log.locator("li")
            expect(entries).to_have_count(3)
            assert [entries.nth(i).get_attribute("data-level") for i in range(3)] == ["info", "warning", "error"]
            expect(entries.nth(0)).to_contain_text('info chatty')
            expect(entries.nth(2).locator("pre")).to_contain_text('"why": "x"')
            check_axe(page, "run trace with an MCP server's log")
            screenshot(tool, "console-trace-server-log.png")


def test_the_trace_of_a_working_run_follows_it_until_it_ends(world, live_server_url):
    import contextvars
    import threading

    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Slow agent")
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    run = Run.all_tenants.create(tenant=world.tenant, session=session, user=world.member, input="take your time",
                                 status="running", started_at=timezone.now())

    def finish():  # the ORM outside Playwright's event-loop thread
        updated = Run.all_tenants.filter(pk=run.pk).update(status="completed", reply="All done.",
                                                           finished_at=timezone.now())
        assert updated == 1

    with open_page() as page:
        log_in(page, live_server_url, world.admin.username)
        page.goto(live_server_url + f"/admin/agent_sessions/run/{run.pk}/trace/")
        expect(page.get_by_test_id("run-status")).to_have_text("Running")
        worker = threading.Thread(target=contextvars.copy_context().run, args=(finish,))  # with the test's scope
        worker.start()
        worker.join()
        expect(page.get_by_test_id("run-status")).to_have_text("Completed", timeout=10_000)
        expect(page.get_by_test_id("trace-reply")).to_have_text("All done.")


@pytest.mark.usefixtures("no_enqueue")
def test_admin_copies_how_to_call_an_agent_from_each_protocol(world, live_server_url):
    """The agent page's "Call this agent" snippets (OpenAI API, MCP, A2A) each copy with their
    button (console.js, under the console's CSP)."""
    from playwright.sync_api import expect

    agent = agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Docs assistant")
    with open_page(height=1400) as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server_url)
        log_in(page, live_server_url, world.admin.username)
        page.goto(f"{live_server_url}/admin/agents/agentinstance/{agent.pk}/change/")
        box = page.get_by_test_id("call-agent")
        expect(box.get_by_test_id("call-mcp-url")).to_have_text(live_server_url + "/mcp/agents/")
        expect(box.get_by_test_id("call-a2a-card")).to_have_text(
            live_server_url + "/a2a/docs-assistant/.well-known/agent-card.json")
        for name in ("openai", "mcp", "a2a"):
            box.get_by_test_id(f"call-copy-{name}").click()
            expect(box.get_by_test_id("call-copy-status")).to_have_text("Copied to the clipboard.")
            copied = page.evaluate("() => navigator.clipboard.readText()")
            assert copied == box.get_by_test_id(f"call-snippet-{name}").inner_text(), name
            page.evaluate("() => navigator.clipboard.writeText('')")
        assert '"method": "SendMessage"' in copied and "A2A-Version: 1.0" in copied
        assert not [e for e in page.console_errors if "Content Security Policy" in e], page.console_errors
        check_axe(page, "agent page with the call snippets")
