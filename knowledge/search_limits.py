"""The REST search's argument limits, applied wherever a search is asked for outside REST (the
knowledge MCP server, the agents' ``knowledge_search`` tool): one check, the serializer's."""

from __future__ import annotations

from typing import Any


def _flat_errors(detail: Any) -> list[str]:
    """DRF's error detail (lists, dicts by field or by item index) as plain messages."""
    if isinstance(detail, dict):
        return [m for value in detail.values() for m in _flat_errors(value)]
    if isinstance(detail, list):
        return [m for value in detail for m in _flat_errors(value)]
    return [str(detail)]


def rest_limits_refusal(*, query: str, top_k: int, document_ids: list[int], tags: list[str],
                        knowledge_base_ids: list[int] | None) -> str:
    """What the REST search's serializer (``knowledge.api.views.SearchSerializer``) refuses in
    these arguments: NUL characters in ``query`` or a tag, more than 1,000 ``document_ids``,
    more than 20 tags or a tag over 64 characters; and more than 1,000 ``knowledge_base_ids``
    (the cap of ``document_ids``). Each such argument would otherwise reach the database
    (a NUL is refused by PostgreSQL, 100,000 ids exceed its 65,535 parameters).

    Returns:
        ``"<argument>: <reason>"`` of the first refused argument (``filters.document_ids``,
        ``filters.tags`` for the filters), or "" when all pass.
    """
    from rest_framework import serializers

    from knowledge.api.views import SearchSerializer

    checked = SearchSerializer(data={"query": query, "top_k": top_k, "document_ids": document_ids, "tags": tags})
    if not checked.is_valid():
        names = {"document_ids": "filters.document_ids", "tags": "filters.tags"}
        field, detail = next(iter(checked.errors.items()))
        return f"{names.get(field, field)}: {_flat_errors(detail)[0]}"
    if knowledge_base_ids is not None:
        cap = SearchSerializer().fields["document_ids"].max_length
        try:
            serializers.ListField(child=serializers.IntegerField(), max_length=cap).run_validation(knowledge_base_ids)
        except serializers.ValidationError as exc:
            return f"knowledge_base_ids: {_flat_errors(exc.detail)[0]}"
    return ""
