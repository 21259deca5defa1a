"""The runner's turn save counts its own LLM call in the monthly usage rollup; a row-level
trigger counts every other inserted call, instead of the statement-level ``INSERT`` trigger
of ``0009_usage_month``.

Why (bench/README.md, "What PostgreSQL spends per run"): the statement-level trigger ran on
every model turn's save (``sessions.runs.statements.TURN_SAVE_SQL``, one LLM call row): a
transition table, a PL/pgSQL call and its nested ``INSERT … ON CONFLICT`` per statement,
most of the rise of the turn save's execution time (1.38 → 2.59 ms per run at 200
concurrent runs). Now:

- ``LLMCall.rolled_up`` (``NOT NULL DEFAULT false``: a default on a new column is recorded in
  the catalog, no table rewrite): the statement that wrote the row also added it to the
  rollup. Only the turn save writes it ``true``, in the same statement as its rollup CTE, so
  the row and its count commit together or not at all.
- ``usage_month_on_insert`` is now ``AFTER INSERT … FOR EACH ROW WHEN (NOT NEW.rolled_up)``:
  for the runner's rows PostgreSQL evaluates the ``WHEN`` and calls nothing (no function, no
  transition table); every other writer (the runner's failed attempts, the ORM,
  ``llm_calls_record``, fixtures, raw SQL that leaves the column to its default) is counted
  as before, to the same shard (``txid_current() % 8``) and month (``created_at`` in UTC).
  A multi-row ``INSERT`` now writes its rollup row once per call (in the order of its rows)
  instead of once per (tenant, month); the writers of several calls at once write one
  tenant's few attempts (``llm_calls_record``). A bulk load of many calls writes them
  ``rolled_up`` and adds their sums itself in the same statement (bench/budget_check.py).
- The ``UPDATE`` and ``DELETE`` triggers are unchanged: they move and subtract whatever the
  row's ``rolled_up``, since every row is counted once when inserted.

Dropping and creating the trigger locks the calls table against writes until this migration
commits, so no call is inserted without one of the two counting it. Reversed, the
statement-level trigger of ``0009`` comes back and the column goes.
"""

import importlib

from django.db import migrations, models

CALLS = "agent_sessions_llmcall"
ROLLUP = "agent_sessions_usagemonth"
SHARDS = 8  # sessions.models.USAGE_MONTH_SHARDS when this was written (frozen here)

_initial = importlib.import_module("sessions.migrations.0009_usage_month")
STATEMENT_INSERT_TRIGGER = _initial.CREATE_TRIGGERS[:2]
"""0009's function and statement-level trigger for ``INSERT`` (restored when reversed)."""

CREATE_ROW_TRIGGER = [
    f"DROP TRIGGER usage_month_on_insert ON {CALLS}",
    f"DROP FUNCTION {ROLLUP}_on_insert()",
    f"""CREATE FUNCTION {ROLLUP}_on_insert_row() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO {ROLLUP} AS u (tenant_id, month, shard, llm_calls, prompt_tokens, completion_tokens, cost_usd_micros)
    VALUES (NEW.tenant_id, (date_trunc('month', NEW.created_at AT TIME ZONE 'UTC'))::date,
            (txid_current() % {SHARDS})::smallint, 1, NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd_micros)
    ON CONFLICT (tenant_id, month, shard) DO UPDATE SET llm_calls = u.llm_calls + EXCLUDED.llm_calls,
        prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
        completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
        cost_usd_micros = u.cost_usd_micros + EXCLUDED.cost_usd_micros;
    RETURN NULL;
END
$body$""",
    f"""CREATE TRIGGER usage_month_on_insert AFTER INSERT ON {CALLS}
    FOR EACH ROW WHEN (NOT NEW.rolled_up) EXECUTE FUNCTION {ROLLUP}_on_insert_row()""",
]
"""The row-level ``INSERT`` trigger in place of 0009's statement-level one (one statement
each: Django may send them as prepared statements, which hold one command). ``SECURITY
INVOKER`` (the default), as 0009's: row-level security holds the rollup row to the calls'
scope."""
DROP_ROW_TRIGGER = [
    f"DROP TRIGGER usage_month_on_insert ON {CALLS}",
    f"DROP FUNCTION {ROLLUP}_on_insert_row()",
    *STATEMENT_INSERT_TRIGGER,
]


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0012_run_request_options_client_tool'),
    ]

    operations = [
        migrations.AddField(
            model_name='llmcall',
            name='rolled_up',
            field=models.BooleanField(db_default=False, default=False, editable=False, help_text="Added to UsageMonth by the statement that wrote it (the runner's turn save); the INSERT trigger adds every other call."),
        ),
        migrations.RunSQL(CREATE_ROW_TRIGGER, DROP_ROW_TRIGGER),
    ]
