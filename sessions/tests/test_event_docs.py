"""The API reference's table of live events (docs/api.md) names exactly the event types the
platform publishes."""

from __future__ import annotations

import re
from pathlib import Path

from sessions.events import EVENT_TYPES

API_DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _documented_event_types() -> set[str]:
    """Event types in the first column of docs/api.md's "Live events" table (``| `type` | data |``;
    a row may name two, ``content_token`` / ``reasoning_token``)."""
    section = API_DOCS.read_text().split("## Live events", 1)[1]
    table = section.split("| type | data |", 1)[1].split("\n\n", 1)[0]
    names: set[str] = set()
    for row in table.splitlines()[2:]:  # after the header's separator row
        first_cell = row.split("|")[1]
        names.update(re.findall(r"`([a-z_]+)`", first_cell))
    return names


def test_the_api_docs_document_every_event_type_and_no_other() -> None:
    documented = _documented_event_types()
    assert documented, "docs/api.md's event table was not found"
    assert EVENT_TYPES - documented == set(), "published but not documented"
    assert documented - EVENT_TYPES == set(), "documented but never published"
