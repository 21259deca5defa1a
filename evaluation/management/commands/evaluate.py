"""``manage.py evaluate --dataset NAME --agent SLUG --fail-under 0.8 [--tenant SLUG]``: run a
dataset against an agent in this process and fail below a pass rate (for CI pipelines).

The experiment is an ordinary one (it appears in the API and the console), advanced here step
by step with Celery eager (each run executes in this process as it is handed off), so no
worker is needed. Prints the summary; exits 1 when the pass rate is below ``--fail-under`` (or
nothing ran), 2 on a usage error (unknown dataset, agent or tenant).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


@contextlib.contextmanager
def _celery_eager() -> Iterator[None]:
    """Tasks sent meanwhile (a run handed to a worker) run at once, in this process."""
    from celery import current_app as app  # the project's app (agent_platform/__init__.py loads it)

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = before


def _decimal(value: str) -> Decimal:
    try:
        return Decimal(value)
    except InvalidOperation as exc:
        raise CommandError(f"not a number: {value!r}", returncode=2) from exc


class Command(BaseCommand):
    help = "Run a dataset against an agent (synchronously) and exit 1 when the pass rate is below --fail-under."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dataset", required=True, help="The dataset's name.")
        parser.add_argument("--agent", required=True, help="The agent's slug.")
        parser.add_argument("--tenant", help="The tenant's slug (needed when several tenants have the dataset).")
        parser.add_argument("--fail-under", type=float, default=0.0, help="Least pass rate, 0..1 (default 0).")
        parser.add_argument("--repetitions", type=int, default=1)
        parser.add_argument("--max-cost-usd", type=_decimal, default=None)
        parser.add_argument("--scorers", default="", help='JSON list of scorers, e.g. \'[{"type": "facts"}]\'.')
        parser.add_argument(
            "--user", help="Username owning the runs' chats (default: the tenant's first owner or admin)."
        )
        parser.add_argument("--timeout", type=float, default=3600.0, help="Seconds before the experiment fails.")

    def handle(self, *args: Any, **options: Any) -> None:
        from agent_platform.api_errors import ApplicationError
        from evaluation.services import experiment_create, experiment_run_sync
        from tenants.scoping import tenant_scope

        dataset = self._dataset(options["dataset"], options.get("tenant"))
        with tenant_scope(dataset.tenant_id):
            agent = self._agent(options["agent"])
            user = self._user(dataset.tenant_id, options.get("user"))
            scorers = self._scorers(options["scorers"])
            try:
                experiment = experiment_create(
                    dataset=dataset,
                    agent=agent,
                    user=user,
                    repetitions=options["repetitions"],
                    max_concurrency=1,
                    max_cost_usd=options["max_cost_usd"],
                    scorers=scorers,
                    start=False,
                )
            except ApplicationError as exc:
                raise CommandError(exc.message, returncode=2) from exc
            with _celery_eager():
                experiment = experiment_run_sync(experiment_id=experiment.pk, timeout_seconds=options["timeout"])
        self._report(experiment, options["fail_under"])

    def _dataset(self, name: str, tenant_slug: str | None) -> Any:
        from evaluation.models import Dataset
        from tenants.scoping import system_scope

        # tenant-bypass: a command names its tenant by slug, or the dataset's name decides it.
        with system_scope():
            found = Dataset.all_tenants.filter(name=name)
            if tenant_slug:
                found = found.filter(tenant__slug=tenant_slug)
            found = list(found[:2])
        if not found:
            raise CommandError(
                f"No dataset called {name!r}" + (f" in tenant {tenant_slug!r}." if tenant_slug else "."), returncode=2
            )
        if len(found) > 1:
            raise CommandError(f"Several tenants have a dataset called {name!r}: give --tenant.", returncode=2)
        return found[0]

    def _agent(self, slug: str) -> Any:
        from agents.models import AgentInstance

        agent = AgentInstance.objects.filter(slug=slug).first()
        if agent is None:
            raise CommandError(f"No agent with the slug {slug!r} in the dataset's tenant.", returncode=2)
        return agent

    def _user(self, tenant_id: int, username: str | None) -> Any:
        from tenants.models import Membership, Role

        memberships = Membership.objects.filter(tenant_id=tenant_id).select_related("user")
        if username:
            membership = memberships.filter(user__username=username).first()
        else:
            membership = memberships.filter(role__in=[Role.OWNER, Role.ADMIN]).order_by("pk").first()
        if membership is None:
            raise CommandError("No user to own the runs: give --user (a member of the tenant).", returncode=2)
        return membership.user

    def _scorers(self, raw: str) -> Any:
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise CommandError(f"--scorers is not JSON: {exc}", returncode=2) from exc

    def _report(self, experiment: Any, fail_under: float) -> None:
        summary = experiment.summary or {}
        rate = summary.get("pass_rate")
        low, high = summary.get("pass_rate_ci95", [0, 1])
        latency = summary.get("latency_ms") or {}
        self.stdout.write(f"experiment {experiment.pk}: {experiment.status}")
        self.stdout.write(
            f"pass rate: {'-' if rate is None else f'{rate:.3f}'} (95% CI {low:.3f}-{high:.3f}), "
            f"{summary.get('passed', 0)} passed, {summary.get('failed', 0)} failed, "
            f"{summary.get('skipped', 0)} skipped"
        )
        for name, score in (summary.get("scores") or {}).items():
            self.stdout.write(f"  {name}: mean {score['mean']:.3f} over {score['count']}")
        self.stdout.write(
            f"latency p50 {latency.get('p50')} ms, p95 {latency.get('p95')} ms; tokens "
            f"{summary.get('prompt_tokens', 0)} + {summary.get('completion_tokens', 0)}; "
            f"cost {summary.get('cost_usd', 0)} USD"
        )
        if experiment.error:
            self.stdout.write(f"error: {experiment.error}")
        if rate is None or rate < fail_under or experiment.status != "completed":
            raise CommandError(
                f"pass rate {rate} is below {fail_under}"
                if rate is not None
                else f"nothing was scored (experiment {experiment.status})",
                returncode=1,
            )
