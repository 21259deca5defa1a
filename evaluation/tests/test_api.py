"""The evaluation admin API: datasets and items, add from a run, experiments, compare; tenant
admins only, and nothing of another tenant's is seen, changed or started."""

from __future__ import annotations

import pytest

from agents.tests.factories import AgentFactory
from evaluation.models import Dataset, DatasetItem, Experiment, ExperimentResult
from evaluation.tests.builders import dataset_with
from sessions.models import ChatSession, Message, Run
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _run(world, agent, *, text="Which port?", reply="Port 8082.", status="completed", history=()):
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.member)
    position = 0
    for user_text, answer in history:
        earlier = Run.all_tenants.create(
            tenant=world.tenant, session=session, user=world.member, input=user_text, reply=answer, status="completed"
        )
        for role, content in (("user", user_text), ("assistant", answer)):
            Message.all_tenants.create(
                tenant=world.tenant, session=session, run=earlier, position=position, role=role, content=content
            )
            position += 1
    return Run.all_tenants.create(
        tenant=world.tenant, session=session, user=world.member, input=text, reply=reply, status=status
    )


def test_dataset_and_item_crud(world):
    client = world.client(admin=True)
    created = client.post("/api/v1/admin/datasets/", {"name": "docs qa", "description": "README facts"}, format="json")
    assert created.status_code == 201, created.content
    dataset_id = created.json()["id"]
    taken = client.post("/api/v1/admin/datasets/", {"name": "docs qa"}, format="json")
    assert taken.status_code == 400 and "exists already" in taken.json()["message"]
    items = f"/api/v1/admin/datasets/{dataset_id}/items/"
    item = client.post(items, {"input": "Which port?", "expected": {"facts": ["8082"]}}, format="json")
    assert item.status_code == 201, item.content
    bad = client.post(items, {"input": "x", "expected": {"json_schema": {"type": "nope"}}}, format="json")
    assert bad.status_code == 400 and "JSON Schema" in str(bad.json())
    patched = client.patch(
        f"{items}{item.json()['id']}/", {"expected": {"facts": ["8082"], "regex": "80\\d\\d"}}, format="json"
    )
    assert patched.status_code == 200 and patched.json()["input"] == "Which port?"
    listed = client.get(items).json()
    assert listed["count"] == 1 and listed["results"][0]["expected"]["regex"] == "80\\d\\d"
    assert client.get("/api/v1/admin/datasets/").json()["results"][0]["items"] == 1
    assert client.delete(f"{items}{item.json()['id']}/").status_code == 204
    assert client.delete(f"/api/v1/admin/datasets/{dataset_id}/").status_code == 204


def test_add_to_dataset_from_a_run(world):
    agent = AgentFactory(tenant=world.tenant)
    dataset = dataset_with(world.tenant, [])
    run = _run(world, agent, history=[("Hi", "Hello!")])
    client = world.client(admin=True)
    resp = client.post(f"/api/v1/admin/datasets/{dataset.pk}/items/from-run/", {"run": run.pk}, format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["input"] == "Which port?" and body["expected"] == {"reference": "Port 8082."}
    assert body["source_run"] == run.pk
    assert body["messages"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Which port?"},
    ]
    unfinished = _run(world, agent, status="running")
    refused = client.post(f"/api/v1/admin/datasets/{dataset.pk}/items/from-run/", {"run": unfinished.pk}, format="json")
    assert refused.status_code == 400 and "completed run" in refused.json()["message"]


def test_starting_an_experiment_validates_its_input(world, no_enqueue):
    agent = AgentFactory(tenant=world.tenant)
    client = world.client(admin=True)
    empty = dataset_with(world.tenant, [], name="empty")
    resp = client.post("/api/v1/admin/experiments/", {"dataset": empty.pk, "agent": agent.pk}, format="json")
    assert resp.status_code == 400 and resp.json()["message"] == "The dataset has no items."
    dataset = dataset_with(world.tenant, [{"input": "Q?"}])
    for scorers, words in [
        ([{"type": "bleu"}], "type must be"),
        ([{"type": "llm_judge", "route": 999999, "rubric": "r"}], "judge's route was not found"),
    ]:
        resp = client.post(
            "/api/v1/admin/experiments/", {"dataset": dataset.pk, "agent": agent.pk, "scorers": scorers}, format="json"
        )
        assert resp.status_code == 400 and words in str(resp.json()), resp.content
    resp = client.post(
        "/api/v1/admin/experiments/", {"dataset": dataset.pk, "agent": agent.pk, "max_concurrency": 0}, format="json"
    )
    assert resp.status_code == 400 and "max_concurrency" in resp.json()["extra"]["fields"]
    ok = client.post(
        "/api/v1/admin/experiments/", {"dataset": dataset.pk, "agent": agent.pk, "repetitions": 3}, format="json"
    )
    assert ok.status_code == 201 and ok.json()["status"] == "queued"
    assert [s["type"] for s in ok.json()["scorers"]] == ["exact_match", "facts", "regex", "json_schema", "tool_calls"]
    assert ExperimentResult.all_tenants.filter(experiment_id=ok.json()["id"]).count() == 3


def test_members_may_not_use_the_evaluation_api(world):
    client = world.client()
    for url in (
        "/api/v1/admin/datasets/",
        "/api/v1/admin/experiments/",
        "/api/v1/admin/datasets/1/items/",
        "/api/v1/admin/experiments/compare/?a=1&b=2",
    ):
        resp = client.get(url)
        assert resp.status_code == 403, url
        assert resp.json()["message"] == "Only tenant owners and admins may do this."


@pytest.fixture
def ours(world, no_enqueue):
    agent = AgentFactory(tenant=world.tenant)
    dataset = dataset_with(
        world.tenant, [{"input": "secret question", "expected": {"reference": "secret"}}], name="secret dataset"
    )
    with tenant_scope(world.tenant.pk):
        from evaluation.services import experiment_create

        a = experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False)
        b = experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False)
    run = _run(world, agent, text="secret input", reply="secret reply")
    return {"agent": agent, "dataset": dataset, "item": dataset.items.get(), "a": a, "b": b, "run": run}


def test_another_tenants_admin_sees_and_starts_nothing_of_ours(world, other_world, ours):
    client = other_world.client(admin=True)
    theirs_agent = AgentFactory(tenant=other_world.tenant)
    their_dataset = dataset_with(other_world.tenant, [{"input": "theirs"}], name="their dataset")
    d, item, a, b = ours["dataset"], ours["item"], ours["a"], ours["b"]

    def missing(resp):
        assert resp.status_code == 404, resp.content
        assert "secret" not in resp.content.decode()

    assert d.pk not in [x["id"] for x in client.get("/api/v1/admin/datasets/").json()["results"]]
    assert client.get("/api/v1/admin/experiments/").json()["count"] == 0
    for url in (
        f"/api/v1/admin/datasets/{d.pk}/",
        f"/api/v1/admin/datasets/{d.pk}/export/",
        f"/api/v1/admin/datasets/{d.pk}/items/",
        f"/api/v1/admin/datasets/{d.pk}/items/{item.pk}/",
        f"/api/v1/admin/experiments/{a.pk}/",
        f"/api/v1/admin/experiments/compare/?a={a.pk}&b={b.pk}",
    ):
        missing(client.get(url))
    missing(client.patch(f"/api/v1/admin/datasets/{d.pk}/", {"name": "hijacked"}, format="json"))
    missing(client.delete(f"/api/v1/admin/datasets/{d.pk}/items/{item.pk}/"))
    missing(client.post(f"/api/v1/admin/datasets/{d.pk}/import/", {"content": '{"input": "x"}'}, format="json"))
    missing(client.post(f"/api/v1/admin/experiments/{a.pk}/cancel/"))
    missing(client.delete(f"/api/v1/admin/experiments/{a.pk}/"))
    # Pointing at our rows from their own: our dataset, agent and run do not exist for them.
    for body in ({"dataset": d.pk, "agent": theirs_agent.pk}, {"dataset": their_dataset.pk, "agent": ours["agent"].pk}):
        resp = client.post("/api/v1/admin/experiments/", body, format="json")
        assert resp.status_code == 400 and "secret" not in resp.content.decode()
    resp = client.post(
        f"/api/v1/admin/datasets/{their_dataset.pk}/items/from-run/", {"run": ours["run"].pk}, format="json"
    )
    assert resp.status_code == 400 and "run" in resp.json()["extra"]["fields"]
    assert Experiment.all_tenants.filter(tenant=other_world.tenant).count() == 0
    assert DatasetItem.all_tenants.filter(dataset=their_dataset).count() == 1
    assert Dataset.all_tenants.get(pk=d.pk).name == "secret dataset"
    assert Experiment.all_tenants.get(pk=a.pk).status == "queued"


def test_compare_through_the_api(world, ours):
    client = world.client(admin=True)
    a, b = ours["a"], ours["b"]
    ExperimentResult.all_tenants.filter(experiment=a).update(
        status="done", passed=True, scores={"exact_match": {"score": 1.0, "passed": True}}
    )
    ExperimentResult.all_tenants.filter(experiment=b).update(
        status="done", passed=False, scores={"exact_match": {"score": 0.0, "passed": False}}
    )
    body = client.get("/api/v1/admin/experiments/compare/", {"a": a.pk, "b": b.pk}).json()
    assert body["items"][0]["change"] == "regression" and body["counts"]["regression"] == 1
    bad = client.get("/api/v1/admin/experiments/compare/", {"a": "x", "b": b.pk})
    assert bad.status_code == 400
    other = dataset_with(world.tenant, [{"input": "q"}], name="other")
    from evaluation.services import experiment_create

    with tenant_scope(world.tenant.pk):
        c = experiment_create(dataset=other, agent=ours["agent"], user=world.admin, start=False)
    assert client.get("/api/v1/admin/experiments/compare/", {"a": a.pk, "b": c.pk}).status_code == 400
