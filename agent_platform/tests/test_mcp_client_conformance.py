"""The official MCP conformance suite's *client* scenarios (``@modelcontextprotocol/conformance
client``, pinned in scripts/mcp_conformance/package.json) against the platform's MCP client:
the ``auth`` suite (OAuth at the 2025-11-25 wire) and every client scenario 2026-07-28 requires
(``--requirements 2026-07-28``: the auth scenarios again at the stateless wire, and the
request-metadata, header and schema scenarios).

The suite runs scripts/mcp_conformance/client_driver.py once per scenario with its test
server's URL; the driver relays the scenario to this process (:func:`client_driver.serve`), where
it runs as the member of ``world``, on the test database, through the platform's own code:
the McpServer row, Connect (``connection_begin``, the authorization server's redirect,
``connection_complete``), then a run's MCP connection with the user's OAuth connection
(``with_connections``, ``McpConnection``: list and call a tool).

Every scenario must pass but those listed in scripts/mcp_conformance/expected-client-failures.yml
(each with its reason); the suite fails the run on a listed scenario that passes (a stale entry)
as on an unlisted one that fails. The suite's ``npm ci`` is shared with test_mcp_conformance.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent_platform.tests.test_mcp_conformance import NODE, SUITE_DIR, suite  # noqa: F401 (the fixture)
from llm import netrules

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300),
              pytest.mark.usefixtures("all_tenants_scope")]

DRIVER = SUITE_DIR / "client_driver.py"
RUNS = {"auth": ["--suite", "auth"], "2026-07-28": ["--requirements", "2026-07-28"]}
SCENARIO_COUNTS = {"auth": 14, "2026-07-28": 39}
"""Scenarios each run has in the pinned suite (2026-07-28: the 32 it scores, 7 reported only)."""
SUITE_TIMEOUT_SECONDS = 240
SCENARIO_TIMEOUT_MS = 120_000
"""The suite's bound on one client run: scenarios wait their turn in the driver (three at once)."""
FAILED = ("FAILURE", "WARNING")
"""Check statuses that fail a scenario (the suite counts a warning as a failure)."""


def _driver_module():
    spec = importlib.util.spec_from_file_location("mcp_client_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def driver(world, monkeypatch) -> Iterator[str]:
    """The driver's endpoint in this process, as the member of ``world``; the relay's URL.

    The suite's servers name themselves ``localhost`` (in their URLs and metadata) on ports of
    their choosing, a name the outbound address rules always refuse (RFC 6761 loopback);
    here it is allowed on any port, as ``OUTBOUND_ALLOWED_HOSTS`` allows a listed host:port.
    """
    allowed = netrules.outbound_host_allowed
    monkeypatch.setattr(netrules, "outbound_host_allowed",
                        lambda host, port: host.lower() == "localhost" or allowed(host, port))
    url, server = _driver_module().serve(tenant_id=world.tenant.pk, user_id=world.member.pk)
    yield url
    server.shutdown()
    server.server_close()


def _expected_file(run: str) -> Path:
    return SUITE_DIR / f"expected-client-failures-{run}.yml"


def _run(cli: Path, driver_url: str, run: str, output: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MCP_CLIENT_DRIVER_URL": driver_url}
    return subprocess.run(
        [str(NODE), str(cli), "client", "--command", f"{sys.executable} {DRIVER}", *RUNS[run],
         "--timeout", str(SCENARIO_TIMEOUT_MS), "--expected-failures", str(_expected_file(run)),
         "--output-dir", str(output)],
        capture_output=True, text=True, timeout=SUITE_TIMEOUT_SECONDS, env=env,
    )


def _results(output: Path) -> dict[str, dict[str, str]]:
    """``{scenario: {check id: worst status}}`` from the checks each scenario saved."""
    order = {"FAILURE": 3, "WARNING": 2, "SUCCESS": 1}
    results: dict[str, dict[str, str]] = {}
    for path in output.rglob("checks.json"):
        scenario = str(path.parent.relative_to(output)).rsplit("-", 6)[0]  # <scenario>-<ISO time>
        statuses = results.setdefault(scenario, {})
        for check in json.loads(path.read_text()):
            kept = statuses.get(check["id"], "")
            if order.get(check["status"], 0) > order.get(kept, 0):
                statuses[check["id"]] = check["status"]
    return results


def _surprises(results: dict[str, dict[str, str]], entries: list[str]) -> list[str]:
    """Unexpected failures and stale entries (an entry is ``scenario`` or ``scenario:check``;
    a listed check that did not run is tolerated, as the suite tolerates it)."""
    whole = {entry for entry in entries if ":" not in entry}
    listed: dict[str, set[str]] = {}
    for entry in entries:
        if ":" in entry:
            scenario, check = entry.split(":", 1)
            listed.setdefault(scenario, set()).add(check)
    surprises = [f"{entry}: listed, but no such scenario ran" for entry in sorted(entries)
                 if entry.split(":", 1)[0] not in results]
    for scenario, statuses in sorted(results.items()):
        failed = {check for check, status in statuses.items() if status in FAILED}
        if scenario in whole:
            surprises += [f"{scenario}: listed, but it passed"] if not failed else []
            continue
        surprises += [f"{scenario}:{check}: failed ({statuses[check]})" for check in sorted(failed - listed.get(scenario, set()))]
        surprises += [f"{scenario}:{check}: listed, but it passed" for check in sorted(listed.get(scenario, set()))
                      if statuses.get(check) == "SUCCESS"]
    return surprises


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_client_scenarios_pass_but_the_expected_failures(suite, driver, tmp_path, run):  # noqa: F811
    done = _run(suite, driver, run, tmp_path)
    (tmp_path / "suite.log").write_text(f"{done.stdout}\n{done.stderr}")
    report = f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    results = _results(tmp_path)
    assert len(results) == SCENARIO_COUNTS[run], (sorted(results), report)
    entries = yaml.safe_load(_expected_file(run).read_text())["client"]
    assert _surprises(results, entries) == [], report
    assert done.returncode == 0, report


def test_surprises_are_failures_and_stale_entries():
    results = {"a": {"x": "SUCCESS", "y": "WARNING"}, "b": {"x": "SUCCESS"}, "c": {"x": "FAILURE"}}
    assert _surprises(results, ["a:y", "c"]) == []
    assert _surprises(results, ["c"]) == ["a:y: failed (WARNING)"]
    assert _surprises(results, ["a:y", "a:x", "b", "c", "d:z", "c:never"]) == [
        "d:z: listed, but no such scenario ran", "a:x: listed, but it passed", "b: listed, but it passed"]
