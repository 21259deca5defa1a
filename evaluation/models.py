"""Datasets, experiments and their results (docs/admin-guide.md, "Evaluation").

- A :class:`Dataset` is a tenant's named list of :class:`DatasetItem` rows: an input (a user
  message, or a conversation whose last message is the user's) and what a good answer holds
  (``expected``: a reference answer, facts, a regex, a JSON Schema, tool calls).
- An :class:`Experiment` runs every item of a dataset against an agent, ``repetitions`` times,
  each time as an ordinary run in a chat session of its own (usage, budgets and the trace as
  any run), at most ``max_concurrency`` at once and until ``max_cost_usd`` is spent.
- An :class:`ExperimentResult` is one item × repetition: the run, its answer, each scorer's
  score, pass/fail, latency, tokens and cost.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from tenants.scoping import TenantOwnedModel


class Dataset(TenantOwnedModel):
    """A tenant's named set of evaluation items."""

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="evaluation_dataset_unique_name")]

    def __str__(self) -> str:
        return self.name


class DatasetItem(TenantOwnedModel):
    """One question of a dataset and what its answer should hold.

    ``input`` is the user's message; ``messages`` (optional) a conversation given whole,
    ``[{role: user|assistant, content}]``, whose last message is the user's (then ``input`` is
    that message). ``expected`` (all keys optional, :func:`evaluation.scorers.expected_validate`):
    ``{reference: str, facts: [str], regex: str, json_schema: {}, tool_calls: [{name,
    arguments_subset: {}}]}``.
    """

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="items")
    input = models.TextField()
    messages = models.JSONField(default=list, blank=True)
    expected = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    source_run = models.ForeignKey(
        "agent_sessions.Run",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The run this item was made from (add to dataset), if any.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["dataset", "id"]
        verbose_name = "dataset item"


class ExperimentStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


TERMINAL_EXPERIMENT_STATUSES = (ExperimentStatus.COMPLETED, ExperimentStatus.FAILED, ExperimentStatus.CANCELED)


class Experiment(TenantOwnedModel):
    """A dataset run against an agent's current configuration, scored.

    ``scorers``: ``[{type, ...options}]`` (:func:`evaluation.scorers.scorers_validate`); empty:
    the default scorers, each applied to the items whose ``expected`` has what it needs.
    ``summary`` is written when it ends (:func:`evaluation.summary.experiment_summary`).
    """

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="experiments")
    agent = models.ForeignKey("agents.AgentInstance", on_delete=models.CASCADE, related_name="+")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="Who started it: the user of its runs' chat sessions.",
    )
    repetitions = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(20)])
    max_concurrency = models.PositiveSmallIntegerField(
        default=4,
        validators=[MinValueValidator(1), MaxValueValidator(64)],
        help_text="Runs at once, at most.",
    )
    max_cost_usd = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="No new run starts once the experiment has spent this much (runs and judge); blank: no cap.",
    )
    scorers = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=ExperimentStatus.choices, default=ExperimentStatus.QUEUED)
    error = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"Experiment {self.pk} ({self.status})"


class ResultStatus(models.TextChoices):
    PENDING = "pending", "Not started"
    RUNNING = "running", "Its run is under way"
    DONE = "done", "Scored"
    ERROR = "error", "The run failed or could not start"
    SKIPPED = "skipped", "Not run (the cost cap, a cancel)"


class ExperimentResult(TenantOwnedModel):
    """One item × repetition of an experiment: its run, answer and scores.

    ``scores``: ``{scorer: {score: 0..1, passed: bool, detail: str}}``, or ``{scorer:
    {skipped: reason}}`` for a scorer that could not score (no embedder). ``passed``: the run
    completed and every scorer that scored passed (None until scored).
    """

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="results")
    item = models.ForeignKey(DatasetItem, on_delete=models.CASCADE, related_name="+")
    repetition = models.PositiveSmallIntegerField(default=0, help_text="0-based.")
    status = models.CharField(max_length=16, choices=ResultStatus.choices, default=ResultStatus.PENDING)
    run = models.ForeignKey("agent_sessions.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    output = models.TextField(blank=True)
    scores = models.JSONField(default=dict, blank=True)
    passed = models.BooleanField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True, help_text="Run start to finish.")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost_usd_micros = models.BigIntegerField(default=0, help_text="The run's and the judge's, micro-USD.")
    error = models.TextField(blank=True, help_text="Why it failed or was skipped.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta(TenantOwnedModel.Meta):
        ordering = ["experiment", "item", "repetition"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "item", "repetition"], name="evaluation_result_unique"),
        ]
        indexes = [models.Index(fields=["experiment", "status"])]
