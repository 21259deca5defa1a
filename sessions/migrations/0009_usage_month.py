"""The monthly usage rollup (:class:`sessions.models.UsageMonth`), kept by triggers on the
LLM call table, and filled from the calls already there.

The budget check of every model turn summed the month's LLM calls: 22.6 ms at 10k calls this
month, 172 ms at 100k, 1.75 s at 1M (row-level security's filter per row plus the heap
reads). It now reads the month's rollup rows (at most :data:`~sessions.models.
USAGE_MONTH_SHARDS`).

Three statement-level ``AFTER`` triggers with transition tables (one per event: PostgreSQL
allows a transition table only on a trigger of one event, and no column list), so a
multi-row statement (``bulk_create``, a tenant's cascade) costs one write per rollup row it
touches, not one per call. Each writes to the shard ``txid_current() % 8`` of the call's
tenant and month: every statement of a transaction to the same row, so a transaction holds
one rollup row lock per tenant and month whatever the number of its statements (a shard per
call, ``id % 8``, made two transactions of several inserts lock rows in opposite orders:
deadlocks, seen in sessions/tests/test_usage_month.py), and concurrent transactions (other
runs) have other ids, so they mostly lock other rows.

- ``INSERT``: the new calls' sums per (tenant, month) are added (``INSERT … ON CONFLICT DO
  UPDATE SET x = x + EXCLUDED.x``), in key order;
- ``UPDATE``: the new rows added and the old ones subtracted, the same way; a group whose sums
  do not change (a run, agent or user set NULL) is skipped, so nothing is locked for it; a
  shard may go below zero, the month's sum never does;
- ``DELETE``: subtracted from a rollup row that exists (the transaction's shard if there is
  one, else the lowest): only an ``UPDATE``, as a tenant being deleted may have lost its
  rollup rows first in the same cascade, and a negative row made for it would break the
  foreign key at commit.

The functions run as the caller (``SECURITY INVOKER``, the default): row-level security
holds the rollup rows to the same scope as the calls that change them. Creating the
``INSERT`` trigger locks the calls table against writes until this migration commits, and
the rollup is filled after it in the same transaction, so no call is missed or counted twice.
"""

import django.db.models.deletion
import django.db.models.manager
from django.db import migrations, models

CALLS = "agent_sessions_llmcall"
ROLLUP = "agent_sessions_usagemonth"
SHARDS = 8  # sessions.models.USAGE_MONTH_SHARDS when this was written (frozen here)


SHARD = f"(txid_current() % {SHARDS})::smallint"
"""The rollup shard the current transaction writes to."""


def _keyed(rows: str, sign: str = "") -> str:
    """A SELECT of each call of ``rows`` (a table) with its tenant and month (UTC) and its
    ``sign``-ed counts (calls, prompt, completion, cost)."""
    return (
        f"SELECT tenant_id, (date_trunc('month', created_at AT TIME ZONE 'UTC'))::date AS month, "
        f"{sign}1 AS calls, {sign}prompt_tokens::bigint AS prompt, "
        f"{sign}completion_tokens::bigint AS completion, {sign}cost_usd_micros AS cost FROM {rows}"
    )


def _grouped(rows: str, having: str = "") -> str:
    """``rows`` (a SELECT of :func:`_keyed`'s columns) summed per tenant and month, in that
    order, with the transaction's shard."""
    return (
        f"SELECT tenant_id, month, {SHARD} AS shard, sum(calls) AS calls, sum(prompt) AS prompt, "
        f"sum(completion) AS completion, sum(cost) AS cost FROM ({rows}) AS c GROUP BY 1, 2 {having}"
        "ORDER BY 1, 2"
    )


def _add(grouped: str) -> str:
    """Add each row of ``grouped`` to its rollup row (made when missing)."""
    return f"""INSERT INTO {ROLLUP} AS u (tenant_id, month, shard, llm_calls, prompt_tokens, completion_tokens, cost_usd_micros)
    {grouped}
    ON CONFLICT (tenant_id, month, shard) DO UPDATE SET llm_calls = u.llm_calls + EXCLUDED.llm_calls,
        prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
        completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
        cost_usd_micros = u.cost_usd_micros + EXCLUDED.cost_usd_micros"""


_CHANGED = "HAVING sum(calls) <> 0 OR sum(prompt) <> 0 OR sum(completion) <> 0 OR sum(cost) <> 0 "
_BODIES = {
    "insert": _add(_grouped(_keyed("new_calls"))),
    "update": _add(_grouped(f"{_keyed('new_calls')} UNION ALL {_keyed('old_calls', '-')}", _CHANGED)),
    "delete": f"""UPDATE {ROLLUP} AS u SET llm_calls = u.llm_calls - d.calls, prompt_tokens = u.prompt_tokens - d.prompt,
        completion_tokens = u.completion_tokens - d.completion, cost_usd_micros = u.cost_usd_micros - d.cost
    FROM ({_grouped(_keyed("old_calls"))}) AS d
    WHERE u.id = (SELECT x.id FROM {ROLLUP} AS x WHERE x.tenant_id = d.tenant_id AND x.month = d.month
                  ORDER BY x.shard = d.shard DESC, x.shard LIMIT 1)""",
}
_TRANSITIONS = {"insert": "NEW TABLE AS new_calls", "update": "NEW TABLE AS new_calls OLD TABLE AS old_calls",
                "delete": "OLD TABLE AS old_calls"}

CREATE_TRIGGERS = [
    statement
    for event, body in _BODIES.items()
    for statement in (
        f"""CREATE FUNCTION {ROLLUP}_on_{event}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    {body};
    RETURN NULL;
END
$body$""",
        f"""CREATE TRIGGER usage_month_on_{event} AFTER {event.upper()} ON {CALLS}
    REFERENCING {_TRANSITIONS[event]} FOR EACH STATEMENT EXECUTE FUNCTION {ROLLUP}_on_{event}()""",
    )
]
"""One function and one trigger per event (one statement each: Django may send them as
prepared statements, which hold one command)."""
DROP_TRIGGERS = [
    statement
    for event in _BODIES
    for statement in (f"DROP TRIGGER IF EXISTS usage_month_on_{event} ON {CALLS}",
                      f"DROP FUNCTION IF EXISTS {ROLLUP}_on_{event}()")
]
FILL = _add(_grouped(_keyed(CALLS)))
"""Every call already there, into the (empty) rollup."""


class Migration(migrations.Migration):

    dependencies = [
        ('agent_sessions', '0008_llmcall_purpose_agent_user'),
        ('tenants', '0003_membership_pick_invitations_audit'),
    ]

    operations = [
        migrations.CreateModel(
            name='UsageMonth',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('month', models.DateField(help_text="The month's first day (UTC).")),
                ('shard', models.PositiveSmallIntegerField(help_text="The writing transaction's id % 8.")),
                ('llm_calls', models.BigIntegerField(default=0)),
                ('prompt_tokens', models.BigIntegerField(default=0)),
                ('completion_tokens', models.BigIntegerField(default=0)),
                ('cost_usd_micros', models.BigIntegerField(default=0)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.tenant')),
            ],
            options={
                'verbose_name': 'usage month',
                'ordering': ['tenant', '-month', 'shard'],
                'abstract': False,
                'base_manager_name': 'all_tenants',
                'default_manager_name': 'all_tenants',
                'constraints': [models.UniqueConstraint(fields=('tenant', 'month', 'shard'), name='usage_month_tenant_month_shard')],
            },
            managers=[
                ('all_tenants', django.db.models.manager.Manager()),
            ],
        ),
        migrations.RunSQL(CREATE_TRIGGERS, DROP_TRIGGERS),
        migrations.RunSQL(FILL, migrations.RunSQL.noop),
    ]
