"""An experiment's steps without a worker (runs completed by hand): the concurrency limit,
the cost cap, cancel, and the comparison of two experiments."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.tests.factories import AgentFactory
from evaluation.models import Experiment, ExperimentResult
from evaluation.selectors import experiments_compare
from evaluation.services import STEP_DONE, STEP_MORE, experiment_cancel, experiment_create, experiment_step
from evaluation.tests.builders import dataset_with
from sessions.models import Run
from tenants.scoping import tenant_scope

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _complete(run_ids, *, reply="ok", cost_usd_micros=0, status="completed"):
    now = timezone.now()
    Run.all_tenants.filter(pk__in=run_ids).update(
        status=status,
        reply=reply,
        started_at=now - timedelta(milliseconds=250),
        finished_at=now,
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd_micros=cost_usd_micros,
    )


def _running(experiment):
    return list(
        ExperimentResult.all_tenants.filter(experiment=experiment, status="running").values_list("run_id", flat=True)
    )


def _step(experiment):
    with tenant_scope(experiment.tenant_id):
        return experiment_step(experiment_id=experiment.pk)


@pytest.fixture
def agent(world):
    return AgentFactory(tenant=world.tenant)


def _experiment(world, agent, n_items=5, **fields):
    dataset = dataset_with(world.tenant, [{"input": f"Q{n}?", "expected": {"facts": ["ok"]}} for n in range(n_items)])
    with tenant_scope(world.tenant.pk):
        return experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False, **fields)


def test_no_more_than_max_concurrency_runs_at_once(world, agent, no_enqueue):
    experiment = _experiment(world, agent, max_concurrency=2)
    assert _step(experiment) == STEP_MORE
    first = _running(experiment)
    assert len(first) == 2 and Run.all_tenants.filter(status="queued").count() == 2
    assert _step(experiment) == STEP_MORE and _running(experiment) == first  # none ended: none started
    _complete(first[:1])
    _step(experiment)
    assert len(_running(experiment)) == 2 and Run.all_tenants.count() == 3
    while _running(experiment):
        assert len(_running(experiment)) <= 2
        _complete(_running(experiment))
        outcome = _step(experiment)
    assert outcome == STEP_DONE
    experiment.refresh_from_db()
    assert experiment.status == "completed" and experiment.summary["passed"] == 5
    assert experiment.summary["latency_ms"]["p50"] == 250


def test_the_cost_cap_skips_what_is_left_with_the_reason(world, agent, no_enqueue):
    experiment = _experiment(world, agent, max_concurrency=2, max_cost_usd="0.0035")
    _step(experiment)
    _complete(_running(experiment), cost_usd_micros=2000)  # 0.004 USD spent: over the cap
    assert _step(experiment) == STEP_DONE
    experiment.refresh_from_db()
    statuses = list(ExperimentResult.all_tenants.filter(experiment=experiment).values_list("status", flat=True))
    assert sorted(statuses) == ["done", "done", "skipped", "skipped", "skipped"]
    assert experiment.status == "completed" and experiment.summary["skipped"] == 3
    assert experiment.summary["stopped"] == (
        "Skipped: the experiment's cost cap (0.0035 USD) was reached (0.004000 USD spent)."
    )


def test_a_running_runs_spending_counts_toward_the_cap(world, agent, no_enqueue):
    experiment = _experiment(world, agent, max_concurrency=1, max_cost_usd="0.001")
    _step(experiment)
    Run.all_tenants.filter(pk__in=_running(experiment)).update(status="running", cost_usd_micros=1500)
    assert _step(experiment) == STEP_MORE  # the running one goes on; nothing new starts
    assert ExperimentResult.all_tenants.filter(experiment=experiment, status="skipped").count() == 4
    _complete(_running(experiment), cost_usd_micros=1500)
    assert _step(experiment) == STEP_DONE


def test_a_failed_run_is_a_failed_item_with_its_error(world, agent, no_enqueue):
    experiment = _experiment(world, agent, n_items=1)
    _step(experiment)
    run_id = _running(experiment)[0]
    Run.all_tenants.filter(pk=run_id).update(error="Every route entry failed.")
    _complete([run_id], status="failed")
    _step(experiment)
    result = ExperimentResult.all_tenants.get(experiment=experiment)
    assert (result.status, result.passed, result.error) == ("error", False, "Every route entry failed.")
    experiment.refresh_from_db()
    assert experiment.summary["pass_rate"] == 0.0 and experiment.summary["errors"] == 1


def test_cancel_skips_the_rest_and_cancels_the_runs(world, agent, no_enqueue):
    experiment = _experiment(world, agent, max_concurrency=2)
    _step(experiment)
    running = _running(experiment)
    with tenant_scope(world.tenant.pk):
        experiment_cancel(experiment=experiment)
    experiment.refresh_from_db()
    assert experiment.status == "canceled" and experiment.summary["skipped"] == 5
    assert set(Run.all_tenants.filter(pk__in=running).values_list("status", flat=True)) == {"cancelled"}
    assert _step(experiment) == STEP_DONE


def _scored(experiment, item, rep, passed, score):
    ExperimentResult.all_tenants.filter(experiment=experiment, item=item, repetition=rep).update(
        status="done", passed=passed, scores={"facts": {"score": score, "passed": passed}}
    )


def test_comparison_puts_regressions_first(world, agent, no_enqueue):
    dataset = dataset_with(world.tenant, [{"input": f"Q{n}?", "expected": {"facts": ["ok"]}} for n in range(5)])
    items = list(dataset.items.order_by("pk"))
    with tenant_scope(world.tenant.pk):
        a = experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False, repetitions=2)
        b = experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False, repetitions=2)
    # A: item0 2/2, item1 2/2, item2 0/2, item3 1/2 (0.5), item4 1/2 (0.4); B: item0 2/2, item1 0/2 (a big
    # drop), item2 2/2, item3 1/2 (0.5), item4 1/2 but a higher score.
    plan = {0: ((1, 1), (1, 1)), 1: ((1, 1), (0, 0)), 2: ((0, 0), (1, 1)), 3: ((1, 0), (1, 0)), 4: ((1, 0), (1, 0))}
    for n, (in_a, in_b) in plan.items():
        for rep in range(2):
            _scored(a, items[n], rep, bool(in_a[rep]), 1.0 if in_a[rep] else (0.4 if n == 4 else 0.0))
            _scored(b, items[n], rep, bool(in_b[rep]), 1.0 if in_b[rep] else (0.8 if n == 4 else 0.0))
    ExperimentResult.all_tenants.filter(experiment=b, item=items[0], repetition=1).update(
        status="done", passed=False, scores={"facts": {"score": 0.0, "passed": False}}
    )
    with tenant_scope(world.tenant.pk):
        compared = experiments_compare(a=Experiment.objects.get(pk=a.pk), b=Experiment.objects.get(pk=b.pk))
    order = [(row["item"], row["change"], row["delta"]) for row in compared["items"]]
    assert order == [
        (items[1].pk, "regression", -1.0),
        (items[0].pk, "regression", -0.5),
        (items[2].pk, "improvement", 1.0),
        (items[4].pk, "improvement", 0.2),
        (items[3].pk, "same", 0.0),
    ]
    assert compared["counts"] == {"regression": 2, "improvement": 2, "missing": 0, "same": 1}


def test_an_item_with_a_conversation_runs_in_a_chat_holding_it(world, agent, no_enqueue):
    from evaluation.models import DatasetItem
    from sessions.models import Message

    dataset = dataset_with(world.tenant, [], name="chats")
    DatasetItem.all_tenants.create(
        tenant=world.tenant,
        dataset=dataset,
        input="And in Tokyo?",
        messages=[
            {"role": "user", "content": "Time in Paris?"},
            {"role": "assistant", "content": "14:05."},
            {"role": "user", "content": "And in Tokyo?"},
        ],
    )
    with tenant_scope(world.tenant.pk):
        experiment = experiment_create(dataset=dataset, agent=agent, user=world.admin, start=False)
    _step(experiment)
    run = Run.all_tenants.select_related("session").get(pk=_running(experiment)[0])
    history = list(Message.all_tenants.filter(session=run.session).order_by("position").values_list("role", "content"))
    assert history == [("user", "Time in Paris?"), ("assistant", "14:05."), ("user", "And in Tokyo?")]
    assert run.input == "And in Tokyo?" and run.user_id == world.admin.pk
    assert run.session.title.startswith(f"Evaluation {experiment.pk} · item ")
