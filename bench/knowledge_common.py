"""Shared by bench/knowledge_search.py and bench/knowledge_quality.py: Django on the
development database (through _harness, in system scope like any operator script), the
embedded embedder in a process of its own, throwaway tenants."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

import _harness  # noqa: E402,F401  (Django set up, system scope entered)

from tenants.models import Tenant  # noqa: E402
from tenants.services import tenant_create  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def embedder(threads: int | None = None) -> Iterator[str]:
    """The embedded all-MiniLM-L6-v2 (llama.cpp, scripts/llm_server.py) on a free port; yields
    its ``/v1`` base URL, allowed as an outbound host for this process."""
    import llm_server
    import setup_embedder
    from django.conf import settings

    port = free_port()
    settings.OUTBOUND_ALLOWED_HOSTS = [*settings.OUTBOUND_ALLOWED_HOSTS, f"127.0.0.1:{port}"]
    env = {**os.environ, "LLM_ROLE": "embeddings", "EMBEDDINGS_PORT": str(port), "EMBEDDINGS_HOST": "127.0.0.1",
           "EMBEDDINGS_MODEL_PATH": str(setup_embedder.ensure_embedder()), "LLM_VERBOSE": "false"}
    if threads:
        env["LLM_N_THREADS"] = env["EMBEDDINGS_N_THREADS"] = str(threads)
    (ROOT / "var" / "log").mkdir(parents=True, exist_ok=True)
    with open(ROOT / "var" / "log" / "bench-knowledge-embeddings.log", "w") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "llm_server.py")], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            if not llm_server.wait_ready(url, timeout_seconds=120):
                raise RuntimeError("the embeddings server did not start; see var/log/bench-knowledge-embeddings.log")
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=20)


@contextlib.contextmanager
def throwaway_tenants(count: int) -> Iterator[list[Tenant]]:
    """``count`` new tenants, deleted (with everything they own) on exit."""
    tenants = []
    try:
        for _ in range(count):
            slug = f"bench-kb-{uuid.uuid4().hex[:8]}"
            tenants.append(tenant_create(name=slug, slug=slug))
        yield tenants
    finally:
        for tenant in tenants:
            tenant.delete()


def embedding_provider(tenant: Tenant, url: str):
    from llm.models import ModelProvider

    # no clean(): the embedder listens on 127.0.0.1 (allowed above for this process only)
    provider, _ = ModelProvider.all_tenants.get_or_create(tenant=tenant, name="bench embedder",
                                                          defaults={"base_url": url})
    return provider
