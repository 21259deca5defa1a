"""Django's PostgreSQL backend with the tenant scope applied by the database (:mod:`tenants.rls`).

``ENGINE = "agent_platform.postgresql"``. The same backend as Django's, plus:

- every cursor's statements run as the application role, with the connection's
  ``app.tenant_ids``/``app.all_tenants`` set to the scope of the code that made the cursor
  (:func:`tenants.rls.sync`: a round trip only when that changed on the connection);
- what was set is forgotten on every rollback and savepoint rollback (they undo a
  ``set_config`` made in their transaction), and when a connection goes back to the pool
  inside a transaction (the pool rolls it back);
- the connection Django opens without a database (``_nodb_cursor``: creating and dropping the
  test database) logs in as the database's owner (``DATABASE_OWNER_URL``:
  :func:`tenants.rls.owner_settings`), since the application's role may not create
  databases, and is otherwise left alone.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus

from tenants import rls


class DatabaseWrapper(base.DatabaseWrapper):
    """Django's PostgreSQL ``DatabaseWrapper`` with :mod:`tenants.rls` applied (module docstring)."""

    def __init__(self, settings_dict: dict[str, Any], alias: str = DEFAULT_DB_ALIAS) -> None:
        if alias == NO_DB_ALIAS:
            settings_dict = rls.owner_settings(settings_dict)
        super().__init__(settings_dict, alias)

    def create_cursor(self, name: str | None = None) -> Any:
        if self.alias != NO_DB_ALIAS:
            rls.sync(self.connection)
        return super().create_cursor(name)

    def _rollback(self) -> None:
        rls.forget(self.connection)
        super()._rollback()

    def _savepoint_rollback(self, sid: str) -> None:
        # Sent straight on the driver's connection: this backend's cursor would first re-send the
        # scope (forgotten: the rollback undoes a set_config made since the savepoint), which the
        # aborted transaction refuses, and the outer transaction could never be used again.
        rls.forget(self.connection)
        with self.wrap_database_errors:
            self.connection.execute(self.ops.savepoint_rollback_sql(sid))

    def _close(self) -> None:
        if self.connection is not None and self.connection.info.transaction_status != TransactionStatus.IDLE:
            rls.forget(self.connection)
        super()._close()
