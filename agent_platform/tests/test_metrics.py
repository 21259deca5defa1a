"""GET /metrics (agent_platform/metrics_view.py): the operator's bearer token, the GenAI metrics
of a model call, run ends, HTTP latency by view, the live gauges; multiprocess mode's sum of
two processes' files (agent_platform/metrics.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client

from agent_platform import metrics
from llm.records import AttemptRecord

TOKEN = "s3cret-metrics-token"


def _attempt(**fields) -> AttemptRecord:
    base = dict(entry_index=0, provider_name="p0", model="metrics-test-model", attempt=1, latency_ms=1500,
                first_token_ms=120, prompt_tokens=300, completion_tokens=40, usage_estimated=False,
                status="succeeded", error_class=None, error="")
    return AttemptRecord(**(base | fields))


@pytest.mark.django_db
def test_metrics_is_404_without_the_setting_and_401_without_the_token(settings):
    settings.METRICS_BEARER_TOKEN = ""
    assert Client().get("/metrics").status_code == 404
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 404
    settings.METRICS_BEARER_TOKEN = TOKEN
    for header in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": f"Basic {TOKEN}"},
                   {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}x"}):
        response = Client().get("/metrics", **header)
        assert response.status_code == 401, header
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"gen_ai" not in response.content


@pytest.mark.django_db
def test_metrics_with_the_token(settings, world):
    settings.METRICS_BEARER_TOKEN = TOKEN
    metrics.model_attempt_observe(_attempt(), provider="openai")
    metrics.model_attempt_observe(_attempt(status="failed", error_class="rate_limit", first_token_ms=None,
                                           completion_tokens=0), provider="openai")
    metrics.run_ended(status="failed", reason="model_unavailable")
    world.client().get("/api/v1/agents/")  # an API view: its latency by view name
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    labels = 'gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="metrics-test-model"'
    assert f'gen_ai_client_token_usage_sum{{{labels},gen_ai_token_type="input"}}' in text
    # (labels come out sorted by name)
    assert f'gen_ai_client_operation_duration_seconds_count{{error_type="rate_limit",{labels}}} 1.0' in text
    assert f'gen_ai_client_operation_duration_seconds_count{{error_type="",{labels}}} 1.0' in text
    assert f"gen_ai_client_operation_time_to_first_chunk_seconds_count{{{labels}}}" in text
    assert 'agent_platform_runs_ended_total{depth="0",reason="model_unavailable",status="failed"}' in text
    http = [line for line in text.splitlines() if line.startswith("agent_platform_http_request_duration_seconds_count")]
    assert any('method="GET"' in line and 'status="2xx"' in line and 'view="agent-list"' in line for line in http)
    assert 'agent_platform_runs{status="queued"}' in text
    assert "agent_platform_approvals_waiting" in text
    assert "agent_platform_celery_queue_length{queue=" in text


def test_multiprocess_mode_sums_the_processes(tmp_path):
    """Two processes write their own files in PROMETHEUS_MULTIPROC_DIR; one scrape sums them."""
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    record = ("from agent_platform import metrics\n"
              "metrics.sandbox_spawned('cli')\n"
              "metrics.mcp_session_opened()\n")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", record], env=env, check=True, timeout=60)
    scrape = ("from prometheus_client import CollectorRegistry, generate_latest, multiprocess\n"
              "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r)\n"
              "print(generate_latest(r).decode())\n")
    out = subprocess.run([sys.executable, "-c", scrape], env=env, check=True, timeout=60, capture_output=True,
                         text=True).stdout
    assert 'agent_platform_sandbox_spawns_total{kind="cli"} 2.0' in out
    # livesum: the two (exited, not yet marked dead) processes' sessions add up ...
    assert "agent_platform_mcp_pool_sessions 2.0" in out
    # ... and a process marked dead drops out.
    pids = sorted(int(p.stem.rsplit("_", 1)[1]) for p in tmp_path.glob("gauge_livesum_*.db"))
    subprocess.run([sys.executable, "-c", f"from prometheus_client import multiprocess; "
                    f"multiprocess.mark_process_dead({pids[0]})"], env=env, check=True, timeout=60)
    out = subprocess.run([sys.executable, "-c", scrape], env=env, check=True, timeout=60, capture_output=True,
                         text=True).stdout
    assert "agent_platform_mcp_pool_sessions 1.0" in out


def test_the_grafana_dashboard_queries_only_metrics_that_exist():
    import json
    import re
    from pathlib import Path

    from agent_platform.metrics_view import LIVE_GAUGES

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    labels = {"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"}
    used = {re.sub(r"_(bucket|sum|count|total)$", "", name)
            for e in exprs for name in re.findall(r"\b(?:gen_ai|agent_platform)_[a-z_]+\b", e)} - labels
    known = {m.name for c in metrics.ALL_METRICS for m in c.describe()} | set(LIVE_GAUGES)
    assert len(exprs) >= 15 and used and used <= known, used - known
    assert known - used == set(), "every metric is on the dashboard"
