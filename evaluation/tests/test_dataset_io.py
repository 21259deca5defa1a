"""Import and export of dataset items: JSON Lines and CSV, errors with their line number,
through the functions and through the admin API."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from evaluation.dataset_io import DatasetImportError, items_parse_csv, items_parse_jsonl
from evaluation.models import Dataset, DatasetItem

GOOD_JSONL = "\n".join(
    [
        json.dumps({"input": "Which port?", "expected": {"facts": ["8082"]}, "metadata": {"topic": "setup"}}),
        "",
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"},
                    {"role": "user", "content": "Time in Tokyo?"},
                ],
                "expected": {"tool_calls": [{"name": "get_time", "arguments_subset": {"tz": "Asia/Tokyo"}}]},
            }
        ),
    ]
)


def test_jsonl_items_parse():
    items = items_parse_jsonl(GOOD_JSONL)
    assert [i["input"] for i in items] == ["Which port?", "Time in Tokyo?"]
    assert items[0]["metadata"] == {"topic": "setup"} and len(items[1]["messages"]) == 3


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('{"input": "a"}\n{"input": "b"\n', 2, "invalid JSON"),
        ('{"input": "a"}\n\n{"expected": {}}\n', 3, "input is required"),
        ('{"input": "a", "expected": {"facts": "8082"}}', 1, "facts must be a list"),
        ('{"input": "a", "expected": {"regex": "(["}}', 1, "does not compile"),
        ('{"input": "a", "answer": "b"}', 1, "unknown fields"),
        ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}', 1, "user's"),
        ("[1, 2]", 1, "must be an object"),
    ],
)
def test_a_bad_jsonl_line_is_named(text, line, words):
    with pytest.raises(DatasetImportError) as raised:
        items_parse_jsonl(text)
    assert raised.value.line == line and words in str(raised.value)
    assert str(raised.value).startswith(f"line {line}: ")


def test_csv_items_parse_with_facts_as_json_or_semicolons():
    text = (
        "input,reference,facts,regex,metadata\n"
        '"Which port, please?",8082,"[""8082""]",,\n'
        'How many searches?,,120 ; per minute,\\d+,"{""topic"": ""limits""}"\n'
    )
    items = items_parse_csv(text)
    assert items[0]["input"] == "Which port, please?"
    assert items[0]["expected"] == {"reference": "8082", "facts": ["8082"]}
    assert items[1]["expected"] == {"facts": ["120", "per minute"], "regex": "\\d+"}
    assert items[1]["metadata"] == {"topic": "limits"}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("question,reference\nA,B\n", 1, "input column"),
        ("input,answer\nA,B\n", 1, "unknown columns"),
        ("input,facts\nA,x\nB,[broken\n", 3, "facts is not valid JSON"),
        ('input,reference\n"multi\nline",ok\n,only a reference\n', 4, "input is required"),
        ("input\n", 0, "no items"),
    ],
)
def test_a_bad_csv_row_is_named(text, line, words):
    with pytest.raises(DatasetImportError) as raised:
        items_parse_csv(text)
    assert raised.value.line == line and words in str(raised.value)


@pytest.fixture
def dataset(world):
    from tenants.scoping import system_scope

    with system_scope():
        return Dataset.all_tenants.create(tenant=world.tenant, name="imported")


@pytest.mark.django_db
def test_import_then_export_round_trips_through_the_api(world, dataset):
    client = world.client(admin=True)
    url = f"/api/v1/admin/datasets/{dataset.pk}/"
    resp = client.post(url + "import/", {"file_format": "jsonl", "content": GOOD_JSONL}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["imported"] == 2 and resp.json()["dataset"]["items"] == 2
    exported = client.get(url + "export/", {"file_format": "jsonl"})
    assert exported.status_code == 200 and exported["Content-Type"].startswith("application/x-ndjson")
    assert items_parse_jsonl(exported.content.decode()) == items_parse_jsonl(GOOD_JSONL)
    as_csv = client.get(url + "export/", {"file_format": "csv"}).content.decode()
    again = client.post(url + "import/", {"file": SimpleUploadedFile("items.csv", as_csv.encode())}, format="multipart")
    assert again.status_code == 201, again.content
    from tenants.scoping import system_scope

    with system_scope():
        inputs = list(DatasetItem.all_tenants.filter(dataset=dataset).order_by("pk").values_list("input", flat=True))
    assert inputs == ["Which port?", "Time in Tokyo?"] * 2


@pytest.mark.django_db
def test_a_bad_import_is_a_400_with_the_line_and_imports_nothing(world, dataset):
    client = world.client(admin=True)
    body = GOOD_JSONL + '\n{"input": "x", "expected": {"facts": [""]}}\n'
    resp = client.post(
        f"/api/v1/admin/datasets/{dataset.pk}/import/", {"file_format": "jsonl", "content": body}, format="json"
    )
    assert resp.status_code == 400
    assert resp.json() == {
        "message": "line 4: expected.facts must be a list of non-empty strings (or of lists of them: alternatives, any one counts).",
        "extra": {"line": 4},
    }
    neither = client.post(f"/api/v1/admin/datasets/{dataset.pk}/import/", {"file_format": "csv"}, format="json")
    assert neither.status_code == 400 and "exactly one" in neither.json()["message"]
    from tenants.scoping import system_scope

    with system_scope():
        assert not DatasetItem.all_tenants.filter(dataset=dataset).exists()
