"""Model instances from hand-written SQL, made as Django's querysets make them.

For hot reads whose queryset would cost more CPU to build and compile than to run (Django
builds and compiles the SQL of every queryset anew: ~1 ms for a lookup with three joins on a
2-vCPU machine, against ~0.15 ms to run the same SQL through a cursor; bench/README.md). The
SQL names each model's columns from its ``_meta`` (:func:`select_columns_sql`), so a migration
that adds a column is followed; rows become instances through the backend's and the fields'
converters, then ``Model.from_db`` (:func:`instances`), as the ORM's own do.

Used by the runner's configuration read (:func:`sessions.runner.database._spec_rows`), the
API token's lookup (:func:`tenants.selectors.api_token_authenticate`) and the chat's
(:func:`sessions.selectors.chat_session_get_for_user`); joined rows are split by
:func:`joined_instances`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Model

_converters: dict[tuple[str, type[Model]], list[tuple[int, Any, list[Callable[..., Any]]]]] = {}


def columns_sql(columns: Sequence[str], *, table: str | None = None) -> str:
    """``"a", "b", …`` (``"t"."a", "t"."b", …`` with ``table``): a column list."""
    prefix = f'"{table}".' if table else ""
    return ", ".join(f'{prefix}"{c}"' for c in columns)


def select_columns_sql(model: type[Model], *, qualified: bool = False) -> str:
    """The model's own columns, in ``_meta.concrete_fields`` order (what :func:`instances`
    expects), qualified by its table with ``qualified`` (for joins). Never ``*``: these
    statements may be prepared on long-lived connections (``DB_SERVER_SIDE_BINDING``), and
    PostgreSQL refuses to run a prepared ``SELECT *`` whose result columns changed ("cached plan
    must not change result type"), as they do when a migration adds a column while processes
    of the previous release still run."""
    return columns_sql(tuple(f.column for f in model._meta.concrete_fields),
                       table=model._meta.db_table if qualified else None)


def select_all_sql(model: type[Model]) -> str:
    """``SELECT "a", "b", … FROM "table"`` with :func:`select_columns_sql`."""
    return f'SELECT {select_columns_sql(model)} FROM "{model._meta.db_table}"'


def instances(model: type[Model], rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Rows of :func:`select_columns_sql` ``(model)`` as model instances: each column through
    the backend's and its field's converters (JSON text to objects, time zones and the like),
    then ``Model.from_db``. The converters are looked up once per model and database."""
    fields = model._meta.concrete_fields
    key = (connection.alias, model)
    converters = _converters.get(key)
    if converters is None:
        converters = []
        for i, field in enumerate(fields):
            column = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            if found:
                converters.append((i, column, found))
        _converters[key] = converters
    names = [f.attname for f in fields]
    made = []
    for row in rows:
        if converters:
            row = list(row)
            for i, column, functions in converters:
                value = row[i]
                for convert in functions:
                    value = convert(value, column, connection)
                row[i] = value
        made.append(model.from_db(connection.alias, names, row))
    return made


def joined_instances(models: Sequence[type[Model]], row: Sequence[Any]) -> list[Any]:
    """One row of a join that selects each model's :func:`select_columns_sql` in turn, as one
    instance per model (in ``models``' order)."""
    made, start = [], 0
    for model in models:
        end = start + len(model._meta.concrete_fields)
        made.extend(instances(model, [row[start:end]]))
        start = end
    return made
