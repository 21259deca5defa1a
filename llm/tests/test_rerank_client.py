"""``llm.embeddings.arerank`` / ``rerank``: the ``/v1/rerank`` API of rerank models (Jina,
Cohere v2, vLLM, llama.cpp ``--reranking``), against the scripted server's real HTTP endpoint
(``FakeLLMServer.rerank_with``): scores put back in input order, errors classified and
redacted, malformed answers refused with the reason, the outbound address rules applied."""

from __future__ import annotations

import pytest

from llm.embeddings import RERANK_MAX_DOCUMENTS, EmbeddingEndpoint, EmbeddingError, RerankError, arerank, rerank
from llm.testing import Fail

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _overlap(query: str, documents: list[str]) -> list[float]:
    """Words shared with the query, a stand-in for a cross-encoder's relevance."""
    words = set(query.lower().split())
    return [float(len(words & set(d.lower().split()))) for d in documents]


def _endpoint(server, **fields) -> EmbeddingEndpoint:
    return EmbeddingEndpoint(name="reranker", base_url=server.base_url, **fields)


def test_scores_come_back_in_the_order_of_the_documents(fake_llm):
    fake_llm.rerank_with(_overlap)
    documents = ["birds migrate south", "bears sleep in winter dens", "frogs freeze in winter"]
    scores = rerank(_endpoint(fake_llm), "bge-reranker", "which animals sleep in winter", documents)
    # The server lists its results best first; the client maps them back by index.
    assert scores == [0.0, 3.0, 2.0]
    assert fake_llm.rerank_requests == [{"model": "bge-reranker", "query": "which animals sleep in winter",
                                         "documents": documents, "top_n": 3}]
    assert fake_llm.requests == []  # not a chat completion


async def test_the_async_variant_scores_and_the_sync_one_refuses_a_running_loop(fake_llm):
    fake_llm.rerank_with(_overlap)
    assert await arerank(_endpoint(fake_llm), "m", "winter", ["summer", "winter"]) == [0.0, 1.0]
    with pytest.raises(RuntimeError, match="await arerank"):
        rerank(_endpoint(fake_llm), "m", "winter", ["summer"])


def test_no_documents_is_no_request(fake_llm):
    assert rerank(_endpoint(fake_llm), "m", "q", []) == []
    assert fake_llm.rerank_requests == []


@pytest.mark.parametrize(("query", "documents", "error"), [
    ("", ["a"], ValueError),
    ("q", ["a", "  "], ValueError),
    ("q", ["a"] * (RERANK_MAX_DOCUMENTS + 1), ValueError),
    ("q", "abc", TypeError),
    ("q", [1], TypeError),
])
def test_bad_input_fails_before_any_request(fake_llm, query, documents, error):
    fake_llm.rerank_with(_overlap)
    with pytest.raises(error):
        rerank(_endpoint(fake_llm), "m", query, documents)
    assert fake_llm.rerank_requests == []


@pytest.mark.django_db
def test_a_provider_error_is_classified_and_the_key_redacted(tenant, fake_llm):
    from llm.services import provider_save

    key = "sk-proj-h2Zr8yTestKey0123456789abcdef"
    fake_llm.rerank_with(lambda query, documents: Fail(401, {"error": {
        "message": f"Incorrect API key provided: {key}", "type": "invalid_request_error", "code": "invalid_api_key"}}))
    provider = provider_save(tenant=tenant, name="hosted reranker", base_url=fake_llm.base_url, api_key=key)
    with pytest.raises(RerankError) as caught:
        rerank(provider, "rerank-v3.5", "q", ["a"])
    error = caught.value
    assert isinstance(error, EmbeddingError)  # one family with embeddings errors
    assert error.error_class == "auth" and error.status_code == 401
    assert key not in str(error) and "Incorrect API key" in str(error) and "'hosted reranker'" in str(error)


def test_a_server_error_is_a_server_error(fake_llm):
    fake_llm.rerank_with(lambda query, documents: Fail(503))
    with pytest.raises(RerankError) as caught:
        rerank(_endpoint(fake_llm), "m", "q", ["a"])
    assert caught.value.error_class in {"server", "overloaded"} and caught.value.status_code == 503


def test_a_server_without_a_rerank_endpoint_is_not_found(fake_llm):
    with pytest.raises(RerankError) as caught:  # no reranker set: 404, as a chat-only server answers
        rerank(_endpoint(fake_llm), "m", "q", ["a"])
    assert caught.value.error_class == "not_found"


@pytest.mark.parametrize(("answer", "message"), [
    ([1.0], "expected 2 results, got 1"),  # top_n honoured wrongly: a result missing
    ([1.0, float("nan")], "no finite relevance_score"),
])
def test_a_malformed_answer_is_an_error_with_the_reason(fake_llm, answer, message):
    fake_llm.rerank_with(lambda query, documents: answer)
    with pytest.raises(RerankError, match=message) as caught:
        rerank(_endpoint(fake_llm), "m", "q", ["a", "b"])
    assert caught.value.error_class == "other"


def test_a_repeated_index_or_no_results_is_an_error():
    from llm import embeddings

    with pytest.raises(RerankError, match="index 0 is out of range or repeated"):
        embeddings._rerank_scores({"results": [{"index": 0, "relevance_score": 1}, {"index": 0, "relevance_score": 2}]},
                                  count=2, where="rerank")
    with pytest.raises(RerankError, match="expected 2 results, got no"):
        embeddings._rerank_scores({"data": []}, count=2, where="rerank")


def test_an_anthropic_provider_has_no_rerank_endpoint():
    with pytest.raises(RerankError) as caught:
        rerank(EmbeddingEndpoint(name="claude", base_url="https://api.anthropic.com", api="anthropic"), "m", "q", ["a"])
    assert caught.value.error_class == "bad_request" and "no rerank endpoint" in caught.value.message


def test_a_blocked_address_is_refused_at_connect(settings, fake_llm):
    fake_llm.rerank_with(_overlap)
    settings.OUTBOUND_ALLOWED_CIDRS = []
    settings.OUTBOUND_ALLOWED_HOSTS = []
    with pytest.raises(RerankError) as caught:
        rerank(_endpoint(fake_llm), "m", "q", ["a"])
    assert caught.value.error_class == "network" and "Refused" in caught.value.message
    assert fake_llm.rerank_requests == []
