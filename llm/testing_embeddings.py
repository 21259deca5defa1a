"""The ``embedding_server`` pytest fixture: the real embedded embedding model for tests.

One llama.cpp server (``scripts/llm_server.py`` with ``LLM_ROLE=embeddings``: all-MiniLM-L6-v2,
384-dimensional vectors) per test session, on a free port of 127.0.0.1, started the first
time a test asks for it and stopped at the end of the session. The fixture yields its
OpenAI-style base URL (``http://127.0.0.1:<port>/v1``); point a provider at it::

    def test_chunks_are_embedded(embedding_server, tenant):
        provider = provider_save(tenant=tenant, name="e", base_url=embedding_server)
        [vector] = embed_texts(provider, DEFAULT_EMBEDDING_MODEL, ["hello"])

(the test settings allow 127.0.0.0/8 as an outbound address). The GGUF model is produced by
``scripts/setup_embedder.py`` if missing (``make test`` does it first). The server's log goes
to ``var/log/test-embeddings-<pid>.log`` (removed when the session ends well).

Registered for every app's tests by the root ``conftest.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_SECONDS = 120.0


def _scripts() -> tuple[object, object]:
    """``scripts/llm_server.py`` and ``scripts/setup_embedder.py`` as modules (by file path)."""
    modules = []
    for name in ("llm_server", "setup_embedder"):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        modules.append(sys.modules[name])
    return modules[0], modules[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def embedding_server() -> Iterator[str]:
    """Base URL (``http://127.0.0.1:<port>/v1``) of a real all-MiniLM-L6-v2 server (llama.cpp).

    Skips the test when llama-cpp-python (the ``llm`` extra) is not installed; fails it when
    the model cannot be set up or the server does not answer within
    :data:`START_TIMEOUT_SECONDS`.
    """
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (the 'llm' extra; make test installs it)")
    llm_server, setup_embedder = _scripts()
    try:
        model = setup_embedder.ensure_embedder()
    except setup_embedder.SetupError as exc:
        pytest.fail(f"the embedding model could not be set up: {exc}")
    port = _free_port()
    log_path = ROOT / "var" / "log" / f"test-embeddings-{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "llm_server.py")],
            env={
                **os.environ, "LLM_ROLE": "embeddings", "EMBEDDINGS_MODEL_PATH": str(model),
                "EMBEDDINGS_HOST": "127.0.0.1", "EMBEDDINGS_PORT": str(port), "LLM_VERBOSE": "false",
            },
            stdout=log, stderr=subprocess.STDOUT,
        )
        ok = False
        try:
            if not llm_server.wait_ready(url, timeout_seconds=START_TIMEOUT_SECONDS):
                code = proc.poll()
                raise RuntimeError(
                    f"the embedding server did not start in {START_TIMEOUT_SECONDS:g}s "
                    f"({'exited ' + str(code) if code is not None else 'still starting'}); see {log_path}"
                )
            yield url
            ok = True
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
    if ok:
        log_path.unlink(missing_ok=True)
