"""Experiments end to end on the fake model: through the admin API and a real Celery worker
(each item an ordinary run), and through ``manage.py evaluate`` (eager, in process)."""

from __future__ import annotations

import time

import pytest
from django.core.management import CommandError, call_command

from evaluation.models import Experiment, ExperimentResult
from evaluation.tests.builders import agent_on, answering, dataset_with
from sessions.models import LLMCall, Run
from tenants.scoping import system_scope

QUESTIONS = [
    {"input": "Which port does the embeddings server listen on?", "expected": {"facts": ["8082"]}},
    {"input": "How large may an API body be?", "expected": {"facts": ["2.5 MB"]}},
    {"input": "As which user id does the sandbox run programs?", "expected": {"facts": ["65534"]}},
    {"input": "How many searches a minute may a user make?", "expected": {"facts": ["120"]}},
]
RIGHT = {
    "embeddings": "It listens on port 8082.",
    "API body": "At most 2,5 MB.",
    "sandbox": "As user id 65534.",
    "searches": "120 a minute.",
}


def _wait_ended(experiment_id: int, timeout_seconds: float = 90) -> Experiment:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        with system_scope():
            experiment = Experiment.all_tenants.get(pk=experiment_id)
        if experiment.status in ("completed", "failed", "canceled"):
            return experiment
        time.sleep(0.2)
    raise AssertionError(f"experiment {experiment_id} did not end: {experiment.status}")


def _intervals(experiment_id: int) -> list[tuple[float, float]]:
    with system_scope():
        runs = Run.all_tenants.filter(
            pk__in=ExperimentResult.all_tenants.filter(experiment_id=experiment_id).values("run_id")
        )
        assert {r.purpose for r in runs} == {"evaluation"}
        return [(r.started_at.timestamp(), r.finished_at.timestamp()) for r in runs]


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals], key=lambda e: (e[0], e[1])
    )
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


@pytest.fixture
def fast_polling(settings):
    settings.EVALUATION_POLL_SECONDS = 0.1


def test_an_experiment_runs_through_celery_and_is_scored(world, fake_llm, celery_worker, fast_polling):
    with system_scope():
        agent = agent_on(world.tenant, fake_llm)
        dataset = dataset_with(world.tenant, QUESTIONS)
    answers = dict(RIGHT, sandbox="As user id 1.")  # one wrong answer
    fake_llm.respond(answering(answers, judge='{"score": 0.9, "reason": "clear"}'))
    resp = world.client(admin=True).post(
        "/api/v1/admin/experiments/",
        {
            "dataset": dataset.pk,
            "agent": agent.pk,
            "repetitions": 2,
            "max_concurrency": 3,
            "scorers": ["facts", {"type": "llm_judge", "route": agent.route_id, "rubric": "Answers the question."}],
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    experiment = _wait_ended(resp.json()["id"])
    assert experiment.status == "completed", experiment.error
    detail = world.client(admin=True).get(f"/api/v1/admin/experiments/{experiment.pk}/").json()
    summary = detail["summary"]
    assert (summary["results"], summary["passed"], summary["failed"]) == (8, 6, 2)
    assert summary["pass_rate"] == 0.75 and summary["pass_rate_ci95"] == [0.4093, 0.9285]
    assert summary["scores"]["facts"] == {"mean": 0.75, "count": 8, "passed": 6}
    assert summary["scores"]["llm_judge"]["mean"] == 0.9
    assert summary["latency_ms"]["p50"] is not None and summary["prompt_tokens"] > 0
    wrong = [r for r in detail["results"] if not r["passed"]]
    assert {r["input"] for r in wrong} == {QUESTIONS[2]["input"]}
    assert wrong[0]["scores"]["facts"]["detail"] == "0/1 facts; missing: '65534'"
    assert wrong[0]["trace_url"] == f"/api/v1/runs/{wrong[0]['run']}/trace/"
    with system_scope():
        runs = Run.all_tenants.filter(pk__in=[r["run"] for r in detail["results"]])
        assert runs.count() == 8 and len({r.session_id for r in runs}) == 8  # a chat of its own each
        assert {r.status for r in runs} == {"completed"} and {r.user_id for r in runs} == {world.admin.pk}
        purposes = list(LLMCall.all_tenants.filter(tenant=world.tenant).values_list("purpose", flat=True))
    assert purposes.count("turn") == 8 and purposes.count("evaluation") == 8  # the judge's own calls
    assert _most_at_once(_intervals(experiment.pk)) <= 3


def test_the_concurrency_limit_holds_with_slow_answers(world, fake_llm, celery_worker, fast_polling):
    from llm.testing import Delay

    with system_scope():
        agent = agent_on(world.tenant, fake_llm)
        dataset = dataset_with(
            world.tenant, [{"input": f"Question {n}", "expected": {"facts": ["ok"]}} for n in range(6)]
        )
    fake_llm.respond(lambda body: Delay(0.4, answering({"Question": "ok"})(body)))
    resp = world.client(admin=True).post(
        "/api/v1/admin/experiments/", {"dataset": dataset.pk, "agent": agent.pk, "max_concurrency": 2}, format="json"
    )
    experiment = _wait_ended(resp.json()["id"])
    assert experiment.status == "completed" and experiment.summary["passed"] == 6
    intervals = _intervals(experiment.pk)
    assert len(intervals) == 6
    assert _most_at_once(intervals) == 2  # two at once, never three


def test_the_cost_cap_stops_new_runs(world, fake_llm, celery_worker, fast_polling):
    with system_scope():
        agent = agent_on(world.tenant, fake_llm, price_per_mtok="1")  # 1,000 + 1,000 tokens: 0.002 USD a run
        dataset = dataset_with(world.tenant, QUESTIONS)
    fake_llm.respond(answering(RIGHT, usage=(1000, 1000)))
    resp = world.client(admin=True).post(
        "/api/v1/admin/experiments/",
        {"dataset": dataset.pk, "agent": agent.pk, "max_concurrency": 1, "max_cost_usd": "0.003"},
        format="json",
    )
    experiment = _wait_ended(resp.json()["id"])
    assert experiment.status == "completed"
    with system_scope():
        results = list(ExperimentResult.all_tenants.filter(experiment=experiment).order_by("item_id"))
    assert [r.status for r in results] == ["done", "done", "skipped", "skipped"]
    assert results[2].error.startswith("Skipped: the experiment's cost cap (0.003 USD) was reached (0.004000 USD")
    assert experiment.summary["skipped"] == 2 and experiment.summary["cost_usd"] == 0.004
    assert "cost cap" in experiment.summary["stopped"]


def test_the_evaluate_command_fails_below_the_threshold(world, fake_llm, transactional_db, celery_worker_session):
    with system_scope():
        agent = agent_on(world.tenant, fake_llm, slug="docs")
        dataset_with(world.tenant, QUESTIONS, name="docs qa")
    fake_llm.respond(answering(dict(RIGHT, sandbox="As user id 1.", searches="4 a minute.")))
    with pytest.raises(CommandError) as failed:
        call_command("evaluate", "--dataset", "docs qa", "--agent", "docs", "--fail-under", "0.8")
    assert failed.value.returncode == 1 and "pass rate 0.5 is below 0.8" in str(failed.value)
    fake_llm.respond(answering(RIGHT))
    call_command("evaluate", "--dataset", "docs qa", "--agent", "docs", "--fail-under", "0.8", "--tenant", "acme")
    with system_scope():
        assert list(Experiment.all_tenants.filter(agent=agent).order_by("pk").values_list("status", flat=True)) == [
            "completed",
            "completed",
        ]
    with pytest.raises(CommandError) as unknown:
        call_command("evaluate", "--dataset", "nope", "--agent", "docs")
    assert unknown.value.returncode == 2
