"""The refresh storm (issue 37's guard; LibreChat #12802): 50 runs on 50 threads, each with its
own database connection as separate workers would have, need one expired token at the same
moment: exactly one refresh request reaches the authorization server and every run gets its
token. The fake server holds the first refresh open for a moment, so without the row lock the
others would arrive while it is in flight."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection as db_connection

from capabilities.mcp_oauth.services import connection_access_token
from capabilities.mcp_oauth.tests.fakes import FakeAuthorizationServer, connected, oauth_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

RUNS = 50


def test_fifty_runs_needing_one_expired_token_make_one_refresh_request(world, settings):
    settings.OUTBOUND_ALLOWED_CIDRS = ["127.0.0.1/32"]
    start = threading.Barrier(RUNS)
    with FakeAuthorizationServer(race_window_seconds=0.5) as fake:
        connection = connected(oauth_server(world.tenant), fake, user=world.member, expired=True)

        def one_run(_: int) -> str:
            start.wait(timeout=30)
            try:
                return connection_access_token(tenant_id=world.tenant.pk, connection_id=connection.pk).token
            finally:
                db_connection.close()

        with ThreadPoolExecutor(max_workers=RUNS) as pool:
            tokens = list(pool.map(one_run, range(RUNS)))
    assert len(fake.refreshes) == 1
    assert tokens == ["access-1"] * RUNS
    connection.refresh_from_db()
    assert connection.refresh_count == 1
