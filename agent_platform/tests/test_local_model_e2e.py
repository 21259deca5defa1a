"""End to end on the embedded model: seed_demo's "Assistant" (Qwen2.5-Coder-0.5B-Instruct via
llama.cpp, text tool calls) asked for the time in Tokyo, through the API and a real worker,
with the real mcp-server-time over stdio.

The small model's wording is not asserted: the run must end within its timeout, completed or
failed for a reason the model's own behaviour explains (:data:`MODEL_BEHAVIOUR_REASONS`; never
``internal_error``, ``configuration``, ``capability_unavailable``...: those are the platform's
faults), and its LLM calls must be recorded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.local_model]

MODEL_BEHAVIOUR_REASONS = frozenset({
    "max_loop_count", "model_error", "turn_timeout", "run_timeout", "context_window", "compaction_failed",
})
"""Reasons a 0.5B model may cause by itself (looping on tools, an empty answer, slowness, a long
history); any other reason fails the test."""


@pytest.fixture(scope="session")
def local_model_url():
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (the 'llm' extra; make test installs it)")
    sys.path.insert(0, str(ROOT / "scripts"))
    import llm_server
    import setup_model

    model = setup_model.default_model_path()
    if not model.exists():
        pytest.skip(f"the model is not set up at {model} (make test runs scripts/setup_model.py)")
    from conftest import free_port, stop_process

    port = free_port()
    log = open(ROOT / "var" / "test-llm.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "llm_server.py")],
        env={**os.environ, "LLM_PORT": str(port), "LLM_VERBOSE": "false"}, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        if not llm_server.wait_ready(url, timeout_seconds=180):
            raise RuntimeError(f"the model server did not start; see {log.name}")
        yield url
    finally:
        stop_process(proc, timeout_seconds=20)
        log.close()


def test_demo_assistant_answers_the_time_in_tokyo(local_model_url, celery_worker):
    with override_settings(LLM_BASE_URL=local_model_url):
        call_command("seed_demo")
    from tenants.models import Membership
    from tenants.services import api_token_create

    membership = Membership.all_tenants.get(user__username="demo-user")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_create(membership=membership).raw}")
    [agent] = [a for a in client.get("/api/v1/agents/").json()["results"] if a["name"] == "Assistant"]
    session = client.post("/api/v1/sessions/", {"agent": agent["id"]}, format="json").json()
    posted = client.post(
        f"/api/v1/sessions/{session['id']}/messages/", {"content": "What time is it in Tokyo? Use the tool."},
        format="json",
    ).json()
    run_id = posted["run"]["id"]

    deadline = time.monotonic() + 240
    while True:
        run = client.get(f"/api/v1/runs/{run_id}/").json()
        if run["status"] in ("completed", "failed"):
            break
        assert time.monotonic() < deadline, f"run still {run['status']} after 240 s"
        time.sleep(0.5)
    assert run["status"] == "completed" or run["reason"] in MODEL_BEHAVIOUR_REASONS, run
    activities = client.get(f"/api/v1/runs/{run_id}/activities/").json()["results"]
    llm_calls = [a for a in activities if a["kind"] == "llm_call"]
    assert llm_calls and all(c["model"] == "qwen2.5-coder-0.5b-instruct" for c in llm_calls)
    assert llm_calls[0]["latency_ms"] > 0 and llm_calls[0]["completion_tokens"] > 0
    # Reported, not asserted (a 0.5B model): what the run did.
    print("run:", run["status"], run["reason"], repr(run["reply"][:200]))
    print("tool calls:", [(c["name"], c["status"], c["result"][:80]) for c in run["tool_calls"]])
