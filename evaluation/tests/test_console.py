"""The console's evaluation pages: experiments listed, an experiment's results with links to
the runs' traces, the comparison (regressions first) with its chart; another tenant's admin
gets 404."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from agents.tests.factories import AgentFactory
from evaluation.models import ExperimentResult
from evaluation.services import experiment_create
from evaluation.tests.builders import dataset_with
from sessions.models import ChatSession, Run
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope", "no_enqueue")]


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def experiments(world):
    agent = AgentFactory(tenant=world.tenant)
    dataset = dataset_with(
        world.tenant,
        [
            {"input": "Which port?", "expected": {"facts": ["8082"]}},
            {"input": "How many searches?", "expected": {"facts": ["120"]}},
        ],
    )
    with tenant_scope(world.tenant.pk):
        a = experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False)
        b = experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False)
    session = ChatSession.all_tenants.create(tenant=world.tenant, agent=agent, user=world.admin)
    run = Run.all_tenants.create(
        tenant=world.tenant, session=session, user=world.admin, input="Which port?", status="completed", reply="8081"
    )
    items = list(dataset.items.order_by("pk"))
    ExperimentResult.all_tenants.filter(experiment=a).update(
        status="done", passed=True, scores={"facts": {"score": 1.0, "passed": True}}
    )
    ExperimentResult.all_tenants.filter(experiment=b, item=items[1]).update(
        status="done", passed=True, scores={"facts": {"score": 1.0, "passed": True}}
    )
    ExperimentResult.all_tenants.filter(experiment=b, item=items[0]).update(
        status="done",
        passed=False,
        run=run,
        output="8081",
        scores={"facts": {"score": 0.0, "passed": False, "detail": "0/1 facts; missing: '8082'"}},
    )
    for experiment, rate in ((a, 1.0), (b, 0.5)):
        experiment.status, experiment.summary = (
            "completed",
            {
                "pass_rate": rate,
                "pass_rate_ci95": [0.2, 1.0],
                "results": 2,
                "passed": int(rate * 2),
                "failed": 2 - int(rate * 2),
                "cost_usd": 0,
            },
        )
        experiment.save()
    return {"a": a, "b": b, "run": run, "items": items}


def test_experiment_pages_in_the_console(world, experiments):
    client = _console(world.admin)
    a, b = experiments["a"], experiments["b"]
    listed = client.get("/admin/evaluation/experiment/")
    assert listed.status_code == 200 and f"Experiment {b.pk}" in listed.content.decode()
    page = client.get(f"/admin/evaluation/experiment/{b.pk}/results/").content.decode()
    assert "0/1 facts; missing: &#x27;8082&#x27;" in page
    assert f"/admin/agent_sessions/run/{experiments['run'].pk}/trace/" in page
    assert client.get(f"/admin/evaluation/experiment/{b.pk}/change/").url.endswith(f"/{b.pk}/results/")
    compare = client.get("/admin/evaluation/experiment/compare/", {"a": a.pk, "b": b.pk})
    body = compare.content.decode()
    assert compare.status_code == 200 and 'data-testid="compare-chart"' in body
    assert body.index("Which port?") < body.index("How many searches?")  # the regression first
    assert "1 regression, 0 improvements, 1 unchanged" in body
    picked = client.post(
        "/admin/evaluation/experiment/", {"action": "compare_selected", "_selected_action": [a.pk, b.pk]}
    )
    assert picked.status_code == 302 and picked.url.endswith(f"compare/?a={a.pk}&b={b.pk}")
    assert client.get("/admin/evaluation/dataset/").status_code == 200


def test_another_tenants_admin_gets_404_in_the_console(world, other_world, experiments):
    client = _console(other_world.admin)
    a, b = experiments["a"], experiments["b"]
    assert client.get(f"/admin/evaluation/experiment/{a.pk}/results/").status_code == 404
    assert client.get("/admin/evaluation/experiment/compare/", {"a": a.pk, "b": b.pk}).status_code == 404
    listed = client.get("/admin/evaluation/experiment/").content.decode()
    assert f"Experiment {a.pk}" not in listed


def test_add_to_a_dataset_from_a_runs_trace(world, other_world, experiments):
    from evaluation.models import Dataset, DatasetItem

    run = experiments["run"]
    client = _console(world.admin)
    trace = client.get(f"/admin/agent_sessions/run/{run.pk}/trace/").content.decode()
    assert f'href="/admin/evaluation/dataset/add-run/{run.pk}/"' in trace
    url = f"/admin/evaluation/dataset/add-run/{run.pk}/"
    assert "Add to the dataset" in client.get(url).content.decode()
    added = client.post(url, {"new_name": "from the trace"})
    dataset = Dataset.all_tenants.get(tenant=world.tenant, name="from the trace")
    assert added.status_code == 302 and added.url.endswith(f"/admin/evaluation/dataset/{dataset.pk}/change/")
    item = DatasetItem.all_tenants.get(dataset=dataset)
    assert (item.input, item.expected, item.source_run_id) == ("Which port?", {"reference": "8081"}, run.pk)
    assert _console(other_world.admin).get(url).status_code == 404
    assert _console(other_world.admin).post(url, {"dataset": dataset.pk}).status_code == 404
    assert DatasetItem.all_tenants.filter(dataset=dataset).count() == 1


def test_start_an_experiment_from_the_console(world, other_world, experiments, no_enqueue):
    from evaluation.models import Experiment

    dataset = experiments["a"].dataset
    agent = experiments["a"].agent
    client = _console(world.admin)
    listed = client.get("/admin/evaluation/experiment/").content.decode()
    assert 'href="/admin/evaluation/experiment/start/"' in listed
    assert f'/admin/evaluation/experiment/start/?dataset={dataset.pk}"' in client.get(
        "/admin/evaluation/dataset/"
    ).content.decode()
    form = client.get("/admin/evaluation/experiment/start/", {"dataset": dataset.pk}).content.decode()
    assert f'<option value="{dataset.pk}" selected>' in form and f'<option value="{agent.pk}"' in form
    before = Experiment.all_tenants.count()
    bad = client.post(
        "/admin/evaluation/experiment/start/",
        {"dataset": dataset.pk, "agent": agent.pk, "repetitions": "0", "scorers": ""},
    )
    assert bad.status_code == 200 and "Repetitions: a whole number from 1 to 20." in bad.content.decode()
    bad = client.post(
        "/admin/evaluation/experiment/start/", {"dataset": dataset.pk, "agent": agent.pk, "scorers": "[{"}
    )
    assert "Scorers: not JSON" in bad.content.decode()
    bad = client.post(
        "/admin/evaluation/experiment/start/", {"dataset": dataset.pk, "agent": agent.pk, "scorers": '["nope"]'}
    )
    assert bad.status_code == 200 and Experiment.all_tenants.count() == before
    started = client.post(
        "/admin/evaluation/experiment/start/",
        {"dataset": dataset.pk, "agent": agent.pk, "repetitions": "2", "max_concurrency": "3",
         "max_cost_usd": "0.25", "scorers": '["facts"]'},
    )
    experiment = Experiment.all_tenants.latest("pk")
    assert started.status_code == 302 and started.url.endswith(f"/admin/evaluation/experiment/{experiment.pk}/results/")
    assert (experiment.dataset_id, experiment.agent_id, experiment.repetitions, experiment.max_concurrency) == (
        dataset.pk, agent.pk, 2, 3
    )
    assert experiment.max_cost_usd == Decimal("0.25") and [s["type"] for s in experiment.scorers] == ["facts"]
    assert experiment.results.count() == 4 and experiment.created_by_id == world.admin.pk
    other = _console(other_world.admin)
    assert f'<option value="{dataset.pk}"' not in other.get("/admin/evaluation/experiment/start/").content.decode()
    assert other.post(
        "/admin/evaluation/experiment/start/", {"dataset": dataset.pk, "agent": agent.pk}
    ).status_code == 404
    assert Experiment.all_tenants.count() == before + 1
