"""Writes of the evaluation app: datasets and their items, experiments and their execution.

An experiment advances in steps (:func:`experiment_step`), each under a lock of its row: score
the results whose runs ended, skip what is left once the cost cap is passed, start runs up to
``max_concurrency``, and end the experiment with its summary when nothing is left. The Celery
task :func:`evaluation.tasks.experiment_advance` repeats the step every
``EVALUATION_POLL_SECONDS`` (default 1) until it ends; ``manage.py evaluate`` repeats it in
its own process, runs executed eagerly (:func:`experiment_run_sync`).

Each item × repetition is an ordinary run of the agent in a chat session of its own, owned by
the experiment's creator and titled "Evaluation <id> · item <id> #<n>": the run's model turns
are LLM calls of purpose ``turn`` (usage, budgets and the trace as any run); the LLM judge's
calls have purpose ``evaluation``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import models, transaction
from django.utils import timezone

from agent_platform.api_errors import ApplicationError
from agents.models import AgentInstance
from evaluation.models import (
    TERMINAL_EXPERIMENT_STATUSES,
    Dataset,
    DatasetItem,
    Experiment,
    ExperimentResult,
    ExperimentStatus,
    ResultStatus,
)
from evaluation.scorers import InvalidExpectation, scorers_validate
from evaluation.scoring import ScoringInput, result_score
from evaluation.summary import experiment_summary
from sessions.models import TERMINAL_RUN_STATUSES, ChatSession, Message, MessageRole, Run, RunStatus, ToolCall
from tenants.models import Tenant

MAX_RESULTS_PER_EXPERIMENT = 10_000


def _dataset_name_check(*, tenant: Tenant, name: str, dataset: Dataset | None = None) -> None:
    others = Dataset.objects.filter(tenant=tenant, name=name)
    if dataset is not None:
        others = others.exclude(pk=dataset.pk)
    if others.exists():
        raise ApplicationError(f"A dataset called {name!r} exists already.", extra={"fields": {"name": ["taken"]}})


@transaction.atomic
def dataset_save(*, tenant: Tenant, dataset: Dataset | None = None, **fields: Any) -> Dataset:
    """Create (``dataset`` None) or update a dataset of ``tenant`` (``name``, ``description``).

    Raises:
        ApplicationError: the name is taken in the tenant.
    """
    dataset = dataset or Dataset(tenant=tenant)
    for name, value in fields.items():
        setattr(dataset, name, value)
    _dataset_name_check(tenant=tenant, name=dataset.name, dataset=dataset if dataset.pk else None)
    dataset.full_clean(exclude=["tenant"])
    dataset.save()
    return dataset


@transaction.atomic
def dataset_items_add(
    *, dataset: Dataset, items: Sequence[dict[str, Any]], source_run: Run | None = None
) -> list[DatasetItem]:
    """Add validated items (:func:`evaluation.dataset_io.item_data_validate`'s shape) to
    ``dataset``, in order. Returns the new rows."""
    rows = [
        DatasetItem(
            tenant_id=dataset.tenant_id,
            dataset=dataset,
            input=i["input"],
            messages=i["messages"],
            expected=i["expected"],
            metadata=i["metadata"],
            source_run=source_run,
        )
        for i in items
    ]
    created = DatasetItem.objects.bulk_create(rows)
    Dataset.objects.filter(pk=dataset.pk).update(updated_at=timezone.now())
    return created


def dataset_item_from_run(*, dataset: Dataset, run: Run) -> DatasetItem:
    """A new item of ``dataset`` made from a completed user run ("add to dataset"): input =
    the run's user message, ``messages`` = the chat before it when it had earlier messages
    (users' and assistants' text), ``expected.reference`` = the run's reply, ``source_run``
    = the run.

    Raises:
        ApplicationError: the run is a sub-run or has not completed.
    """
    if run.parent_tool_call_id is not None or run.status != RunStatus.COMPLETED:
        raise ApplicationError("Only a completed run of a chat can be added to a dataset.")
    history = list(
        Message.objects.filter(
            session_id=run.session_id,
            run__lt=run.pk,
            run__superseded_at__isnull=True,
            run__parent_tool_call__isnull=True,
            role__in=[MessageRole.USER, MessageRole.ASSISTANT],
        )
        .exclude(content="")
        .order_by("position")
        .values("role", "content")
    )
    messages = [*history, {"role": "user", "content": run.input}] if history else []
    item = {
        "input": run.input,
        "messages": messages,
        "expected": {"reference": run.reply},
        "metadata": {"source": "run", "run": run.pk},
    }
    return dataset_items_add(dataset=dataset, items=[item], source_run=run)[0]


def _judge_route_check(scorers: Sequence[dict[str, Any]]) -> None:
    from llm.models import ModelRoute

    for config in scorers:
        if config["type"] == "llm_judge" and not ModelRoute.objects.filter(pk=config["route"]).exists():
            raise ApplicationError("The judge's route was not found.", extra={"fields": {"scorers": ["route"]}})


def experiment_create(
    *,
    dataset: Dataset,
    agent: AgentInstance,
    user: AbstractBaseUser,
    repetitions: int = 1,
    max_concurrency: int = 4,
    max_cost_usd: Decimal | None = None,
    scorers: Any = None,
    start: bool = True,
) -> Experiment:
    """A queued experiment of ``dataset`` against ``agent`` (same tenant), one pending result
    per item × repetition; with ``start`` the Celery task takes it on commit
    (:func:`evaluation.tasks.experiment_enqueue`). ``user`` owns its runs' chat sessions.

    Raises:
        ApplicationError: another tenant's agent, an inactive agent, an empty dataset, too many
            results (> 10,000), invalid scorers or a judge route not the tenant's.
    """
    if agent.tenant_id != dataset.tenant_id:
        raise ApplicationError("Agent not found.", extra={"fields": {"agent": ["not found"]}})
    if not agent.is_active:
        raise ApplicationError("This agent is not active.", extra={"fields": {"agent": ["inactive"]}})
    try:
        checked = scorers_validate(scorers)
    except InvalidExpectation as exc:
        raise ApplicationError(str(exc), extra={"fields": {"scorers": [str(exc)]}}) from exc
    _judge_route_check(checked)
    item_ids = list(DatasetItem.objects.filter(dataset=dataset).order_by("pk").values_list("pk", flat=True))
    if not item_ids:
        raise ApplicationError("The dataset has no items.")
    if len(item_ids) * repetitions > MAX_RESULTS_PER_EXPERIMENT:
        raise ApplicationError(f"Items × repetitions is over {MAX_RESULTS_PER_EXPERIMENT}.")
    with transaction.atomic():
        experiment = Experiment(
            tenant_id=dataset.tenant_id,
            dataset=dataset,
            agent=agent,
            created_by=user,
            repetitions=repetitions,
            max_concurrency=max_concurrency,
            max_cost_usd=max_cost_usd,
            scorers=checked,
        )
        experiment.full_clean(exclude=["tenant"])
        experiment.save()
        ExperimentResult.objects.bulk_create(
            [
                ExperimentResult(tenant_id=experiment.tenant_id, experiment=experiment, item_id=item_id, repetition=n)
                for n in range(repetitions)
                for item_id in item_ids
            ]
        )
        if start:
            from evaluation.tasks import experiment_enqueue

            transaction.on_commit(lambda: experiment_enqueue(experiment.pk, experiment.tenant_id))
    return experiment


# --- the steps ---------------------------------------------------------------------------------


def _latency_ms(run: Run) -> int | None:
    if run.started_at is None or run.finished_at is None:
        return None
    return max(0, round((run.finished_at - run.started_at).total_seconds() * 1000 - run.paused_seconds * 1000))


def _result_collect(experiment: Experiment, result: ExperimentResult) -> None:
    """Score ``result`` from its ended run and save it."""
    run = result.run
    result.output = run.reply
    result.latency_ms = _latency_ms(run)
    result.prompt_tokens, result.completion_tokens = run.prompt_tokens, run.completion_tokens
    result.cost_usd_micros = run.cost_usd_micros
    if run.status != RunStatus.COMPLETED:
        result.status, result.passed = ResultStatus.ERROR, False
        result.error = run.error or f"The run ended {run.status}."
    else:
        item = result.item
        calls = list(ToolCall.objects.filter(run=run).order_by("turn", "pk").values("name", "arguments"))
        scored = result_score(
            experiment.scorers,
            ScoringInput(
                tenant_id=experiment.tenant_id,
                question=item.input,
                output=run.reply,
                expected=item.expected or {},
                tool_calls=calls,
                agent_id=experiment.agent_id,
                user_id=experiment.created_by_id,
            ),
        )
        result.scores, result.passed, result.status = scored.scores, scored.passed, ResultStatus.DONE
        result.cost_usd_micros += scored.cost_usd_micros
        result.prompt_tokens += scored.prompt_tokens
        result.completion_tokens += scored.completion_tokens
    result.save()


def _collect_ended(experiment: Experiment) -> None:
    ended = ExperimentResult.objects.filter(
        experiment=experiment, status=ResultStatus.RUNNING, run__status__in=TERMINAL_RUN_STATUSES
    ).select_related("run", "item")
    for result in ended:
        _result_collect(experiment, result)
    # A run deleted under us (its chat purged): nothing to score.
    ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.RUNNING, run__isnull=True).update(
        status=ResultStatus.ERROR, passed=False, error="The run was deleted."
    )


def experiment_spent_usd_micros(experiment: Experiment) -> int:
    """What the experiment has spent so far, micro-USD: its scored results' cost (runs and
    judge) plus what its running runs have spent until now."""
    scored = (
        ExperimentResult.objects.filter(experiment=experiment)
        .exclude(status=ResultStatus.RUNNING)
        .aggregate(total=models.Sum("cost_usd_micros"))["total"]
        or 0
    )
    running = (
        Run.objects.filter(
            pk__in=ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.RUNNING).values("run_id")
        ).aggregate(total=models.Sum("cost_usd_micros"))["total"]
        or 0
    )
    return int(scored) + int(running)


def _cap_reached(experiment: Experiment) -> bool:
    """Whether the cost cap is reached; if so, the pending results are skipped with the reason."""
    if experiment.max_cost_usd is None:
        return False
    spent = experiment_spent_usd_micros(experiment)
    cap = int(experiment.max_cost_usd * 1_000_000)
    if spent < cap:
        return False
    reason = (
        f"Skipped: the experiment's cost cap ({experiment.max_cost_usd.normalize():f} USD) was reached "
        f"({spent / 1_000_000:.6f} USD spent)."
    )
    ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.PENDING).update(
        status=ResultStatus.SKIPPED, error=reason
    )
    if not experiment.summary.get("stopped"):
        experiment.summary = {"stopped": reason}
    return True


def _run_start(experiment: Experiment, result: ExperimentResult) -> Run:
    """An ordinary run answering the result's item (purpose ``evaluation``), in a new chat
    session of the experiment's creator (an item with ``messages``: the conversation before its
    last message as the chat's history)."""
    from sessions.services import chat_from_conversation, chat_session_create, message_post, run_purpose

    item = result.item
    title = f"Evaluation {experiment.pk} · item {item.pk} #{result.repetition + 1}"
    user, agent = experiment.created_by, experiment.agent
    with run_purpose("evaluation"):
        if item.messages and len(item.messages) > 1:
            history = [(m["role"], m["content"]) for m in item.messages[:-1]]
            run = chat_from_conversation(user=user, agent=agent, history=history, content=item.input)
            ChatSession.objects.filter(pk=run.session_id).update(title=title)
            return run
        session = chat_session_create(user=user, agent=agent, title=title)
        return message_post(session=session, user=user, content=item.input)


def _start_runs(experiment: Experiment) -> None:
    running = ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.RUNNING).count()
    slots = experiment.max_concurrency - running
    if slots <= 0:
        return
    pending = list(
        ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.PENDING)
        .select_related("item")
        .order_by("repetition", "item_id")[:slots]
    )
    for result in pending:
        try:
            with transaction.atomic():
                result.run = _run_start(experiment, result)
                result.status = ResultStatus.RUNNING
                result.save(update_fields=["run", "status"])
        except ApplicationError as exc:
            result.status, result.passed, result.error = ResultStatus.ERROR, False, f"The run did not start: {exc}"
            result.save(update_fields=["status", "passed", "error"])


def _finish(experiment: Experiment) -> None:
    rows = list(
        ExperimentResult.objects.filter(experiment=experiment).values(
            "status", "passed", "scores", "latency_ms", "prompt_tokens", "completion_tokens", "cost_usd_micros"
        )
    )
    stopped = experiment.summary.get("stopped")
    experiment.summary = experiment_summary(rows) | ({"stopped": stopped} if stopped else {})
    if experiment.status != ExperimentStatus.CANCELED:
        experiment.status = ExperimentStatus.COMPLETED
    experiment.finished_at = timezone.now()
    experiment.save(update_fields=["summary", "status", "finished_at"])


STEP_DONE, STEP_MORE, STEP_BUSY = "done", "more", "busy"


@transaction.atomic
def experiment_step(*, experiment_id: int) -> str:
    """Advance experiment ``experiment_id`` once (tenant scope required): score the results
    whose runs ended, skip the pending ones if the cost cap is reached, start runs up to
    ``max_concurrency``, and end it (``completed``, with its summary) when no result is
    pending or running. The new runs are handed to workers when this commits.

    Returns:
        :data:`STEP_DONE` (it has ended, or does not exist), :data:`STEP_MORE` (call again
        later) or :data:`STEP_BUSY` (another step holds it: that one goes on).
    """
    experiment = (
        Experiment.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(pk=experiment_id)
        .select_related("agent", "created_by")
        .first()
    )
    if experiment is None:
        return STEP_DONE if not Experiment.objects.filter(pk=experiment_id).exists() else STEP_BUSY
    if experiment.status in TERMINAL_EXPERIMENT_STATUSES:
        return STEP_DONE
    if experiment.status == ExperimentStatus.QUEUED:
        experiment.status, experiment.started_at = ExperimentStatus.RUNNING, timezone.now()
        experiment.save(update_fields=["status", "started_at"])
    _collect_ended(experiment)
    if not _cap_reached(experiment):
        _start_runs(experiment)
    if ExperimentResult.objects.filter(
        experiment=experiment, status__in=[ResultStatus.PENDING, ResultStatus.RUNNING]
    ).exists():
        if experiment.summary.get("stopped"):
            experiment.save(update_fields=["summary"])
        return STEP_MORE
    _finish(experiment)
    return STEP_DONE


def experiment_fail(*, experiment_id: int, error: str) -> None:
    """End an experiment ``failed`` with ``error`` (the task hit an unexpected error); its
    pending results are skipped."""
    with transaction.atomic():
        experiment = Experiment.objects.select_for_update().filter(pk=experiment_id).first()
        if experiment is None or experiment.status in TERMINAL_EXPERIMENT_STATUSES:
            return
        ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.PENDING).update(
            status=ResultStatus.SKIPPED, error="Skipped: the experiment failed."
        )
        experiment.status, experiment.error, experiment.finished_at = (
            ExperimentStatus.FAILED,
            error[:2000],
            timezone.now(),
        )
        experiment.save(update_fields=["status", "error", "finished_at"])


def experiment_cancel(*, experiment: Experiment) -> Experiment:
    """Cancel a queued or running experiment: pending results are skipped, running runs are
    cancelled (:func:`sessions.services.run_cancel`), and the experiment ends ``canceled``
    with the summary of what had been scored.

    Raises:
        ApplicationError: (409) it has already ended.
    """
    from sessions.services import run_cancel

    with transaction.atomic():
        experiment = Experiment.objects.select_for_update().get(pk=experiment.pk)
        if experiment.status in TERMINAL_EXPERIMENT_STATUSES:
            raise ApplicationError("This experiment has already ended.", status_code=409)
        experiment.status = ExperimentStatus.CANCELED
        ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.PENDING).update(
            status=ResultStatus.SKIPPED, error="Skipped: the experiment was canceled."
        )
        running = ExperimentResult.objects.filter(experiment=experiment, status=ResultStatus.RUNNING)
        for result in running.select_related("run"):
            if result.run is not None and result.run.status not in TERMINAL_RUN_STATUSES:
                with contextlib.suppress(ApplicationError):  # it ended meanwhile (409)
                    run_cancel(run=result.run)
        running.update(status=ResultStatus.SKIPPED, passed=None, error="Skipped: the experiment was canceled.")
        _finish(experiment)
    return experiment


def poll_seconds() -> float:
    """``settings.EVALUATION_POLL_SECONDS`` (default 1.0): how often a running experiment is
    advanced."""
    return float(getattr(settings, "EVALUATION_POLL_SECONDS", 1.0))


def experiment_run_sync(
    *, experiment_id: int, timeout_seconds: float | None = None, sleep: Callable[[float], None] = time.sleep
) -> Experiment:
    """Advance the experiment until it ends, in this process (tenant scope required;
    ``manage.py evaluate``, whose runs execute eagerly as they are handed off). Ends it
    ``failed`` after ``timeout_seconds`` (None: no limit). Returns it, reloaded."""
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    while experiment_step(experiment_id=experiment_id) != STEP_DONE:
        if deadline is not None and time.monotonic() > deadline:
            experiment_fail(experiment_id=experiment_id, error=f"Did not end within {timeout_seconds} s.")
            break
        sleep(poll_seconds())
    return Experiment.objects.get(pk=experiment_id)
