"""Dataset items in and out: JSON Lines and CSV (docs/admin-guide.md, "Evaluation").

JSON Lines, one item per line (blank lines skipped)::

    {"input": "Which port does the embeddings server listen on?",
     "expected": {"facts": ["8082"]}, "metadata": {"topic": "setup"}}
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                  {"role": "user", "content": "What time is it in Tokyo?"}],
     "expected": {"tool_calls": [{"name": "get_time", "arguments_subset": {"tz": "Asia/Tokyo"}}]}}

CSV, a header row then one item per row: ``input`` (required), ``reference``, ``facts`` (a
JSON array, or facts separated by ``;``), ``regex``, ``json_schema``, ``tool_calls`` and
``metadata`` (JSON). Empty cells mean "not expected".

A malformed line or row raises :class:`DatasetImportError` naming its line number; nothing of
the file is imported then.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from typing import Any

from evaluation.scorers import InvalidExpectation, expected_validate

MAX_IMPORT_ITEMS = 5000
MAX_INPUT_CHARS = 100_000
CSV_COLUMNS = ("input", "reference", "facts", "regex", "json_schema", "tool_calls", "metadata")
MESSAGE_ROLES = ("user", "assistant")


class DatasetImportError(ValueError):
    """A file that cannot be imported: ``line`` (1-based; 0: the file as a whole) and what is
    wrong."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.reason = message


def _messages_validate(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise InvalidExpectation("messages must be a non-empty list of {role, content}.")
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in MESSAGE_ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise InvalidExpectation(f"messages[{i}] must be {{role: user|assistant, content: string}}.")
    if messages[-1]["role"] != "user":
        raise InvalidExpectation("the last of messages must be the user's.")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def item_data_validate(raw: Any) -> dict[str, Any]:
    """One item as given (an import line, an API body) checked and completed: ``{input,
    messages, expected, metadata}``. ``input`` is required unless ``messages`` is given (then
    it is their last, the user's, message).

    Raises:
        InvalidExpectation: what is wrong.
    """
    if not isinstance(raw, Mapping):
        raise InvalidExpectation("an item must be an object.")
    unknown = sorted(set(raw) - {"input", "messages", "expected", "metadata"})
    if unknown:
        raise InvalidExpectation(f"unknown fields {unknown}; allowed: input, messages, expected, metadata.")
    messages = _messages_validate(raw["messages"]) if raw.get("messages") else []
    text = raw.get("input") if raw.get("input") not in (None, "") else (messages[-1]["content"] if messages else None)
    if not isinstance(text, str) or not text.strip():
        raise InvalidExpectation("input is required (a non-empty string), or messages.")
    if len(text) > MAX_INPUT_CHARS:
        raise InvalidExpectation(f"input is longer than {MAX_INPUT_CHARS} characters.")
    if messages and messages[-1]["content"] != text:
        raise InvalidExpectation("input differs from the last of messages; give one or make them equal.")
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidExpectation("metadata must be an object.")
    return {
        "input": text,
        "messages": messages,
        "expected": expected_validate(raw.get("expected") or {}),
        "metadata": metadata,
    }


def _add(items: list[dict[str, Any]], line: int, raw: Any) -> None:
    if len(items) >= MAX_IMPORT_ITEMS:
        raise DatasetImportError(line, f"more than {MAX_IMPORT_ITEMS} items in one file.")
    try:
        items.append(item_data_validate(raw))
    except InvalidExpectation as exc:
        raise DatasetImportError(line, str(exc)) from exc


def items_parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The items of a JSON Lines file (see the module doc), validated.

    Raises:
        DatasetImportError: the first bad line (invalid JSON, not an item), or no item at all.
    """
    items: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise DatasetImportError(number, f"invalid JSON: {exc}") from exc
        _add(items, number, raw)
    if not items:
        raise DatasetImportError(0, "the file holds no items.")
    return items


def _json_cell(value: str, column: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise InvalidExpectation(f"column {column} is not valid JSON: {exc}") from exc


def _csv_row_item(row: Mapping[str, str | None]) -> dict[str, Any]:
    cells = {k: (v or "").strip() for k, v in row.items() if k}
    expected: dict[str, Any] = {}
    if cells.get("reference"):
        expected["reference"] = cells["reference"]
    if cells.get("facts"):
        facts = cells["facts"]
        expected["facts"] = (
            _json_cell(facts, "facts") if facts.startswith("[") else [f.strip() for f in facts.split(";") if f.strip()]
        )
    if cells.get("regex"):
        expected["regex"] = cells["regex"]
    for column in ("json_schema", "tool_calls"):
        if cells.get(column):
            expected[column] = _json_cell(cells[column], column)
    metadata = _json_cell(cells["metadata"], "metadata") if cells.get("metadata") else {}
    return {"input": (row.get("input") or ""), "expected": expected, "metadata": metadata}


def items_parse_csv(text: str) -> list[dict[str, Any]]:
    """The items of a CSV file with a header row (see the module doc), validated.

    Raises:
        DatasetImportError: no ``input`` column, unknown columns, or the first bad row (line
            numbers count physical lines, the header being line 1).
    """
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    if "input" not in header:
        raise DatasetImportError(1, f"the header must name an input column (columns: {', '.join(CSV_COLUMNS)}).")
    unknown = [c for c in header if c not in CSV_COLUMNS]
    if unknown:
        raise DatasetImportError(1, f"unknown columns {unknown}; allowed: {', '.join(CSV_COLUMNS)}.")
    items: list[dict[str, Any]] = []
    start = reader.line_num + 1
    try:
        for row in reader:
            if None in row:
                raise DatasetImportError(start, "more cells than columns.")
            if any((v or "").strip() for v in row.values()):
                try:
                    raw = _csv_row_item(row)
                except InvalidExpectation as exc:
                    raise DatasetImportError(start, str(exc)) from exc
                _add(items, start, raw)
            start = reader.line_num + 1
    except csv.Error as exc:
        raise DatasetImportError(reader.line_num, f"invalid CSV: {exc}") from exc
    if not items:
        raise DatasetImportError(0, "the file holds no items.")
    return items


def items_parse(text: str, file_format: str) -> list[dict[str, Any]]:
    """:func:`items_parse_jsonl` or :func:`items_parse_csv` by ``file_format`` (``jsonl`` |
    ``csv``)."""
    if file_format == "csv":
        return items_parse_csv(text)
    if file_format == "jsonl":
        return items_parse_jsonl(text)
    raise DatasetImportError(0, f"unknown format {file_format!r}; use jsonl or csv.")


def _item_json(item: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"input": item.input}
    if item.messages:
        data["messages"] = item.messages
    data["expected"] = item.expected or {}
    if item.metadata:
        data["metadata"] = item.metadata
    return data


def items_export_jsonl(items: Iterable[Any]) -> str:
    """Items (DatasetItem rows) as JSON Lines, in the import's shape (re-importable)."""
    return "".join(json.dumps(_item_json(item), ensure_ascii=False) + "\n" for item in items)


def items_export_csv(items: Iterable[Any]) -> str:
    """Items as CSV with the :data:`CSV_COLUMNS` (facts, schema, tool calls and metadata as
    JSON), re-importable. A conversation's earlier messages are not in CSV (use JSON Lines)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for item in items:
        expected = item.expected or {}
        writer.writerow(
            {
                "input": item.input,
                "reference": expected.get("reference", ""),
                "facts": json.dumps(expected["facts"], ensure_ascii=False) if expected.get("facts") else "",
                "regex": expected.get("regex", ""),
                "json_schema": json.dumps(expected["json_schema"]) if "json_schema" in expected else "",
                "tool_calls": json.dumps(expected["tool_calls"]) if expected.get("tool_calls") else "",
                "metadata": json.dumps(item.metadata, ensure_ascii=False) if item.metadata else "",
            }
        )
    return out.getvalue()
