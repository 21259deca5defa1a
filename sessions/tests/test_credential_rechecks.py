"""Open streams' credential re-checks are answered together (sessions/stream_guard.py,
``credential_valid``): the re-checks one event loop asks for within
``CREDENTIAL_BATCH_SECONDS`` share one set of queries, and each gets its own credential's
answer."""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions import stream_guard
from sessions.stream_guard import StreamCredential, credential_valid, credentials_valid_sync
from tenants.models import ApiToken, Membership
from tenants.scoping import system_scope
from tenants.services import api_token_create, api_token_revoke

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]


def _token_credential(membership: Membership) -> StreamCredential:
    with system_scope():
        token = api_token_create(membership=membership).token
    return StreamCredential(user_id=membership.user_id, membership_id=membership.pk, token_id=token.pk)


@pytest.fixture
def credentials(world, other_world):
    """Five token credentials: valid, revoked, a deactivated user's, a removed membership's,
    and one whose token belongs to another membership (as a forged credential would)."""
    valid = _token_credential(world.member_membership)
    revoked = _token_credential(world.member_membership)
    with system_scope():
        api_token_revoke(token=ApiToken.all_tenants.get(pk=revoked.token_id))
    inactive = _token_credential(other_world.member_membership)
    other_world.member.is_active = False
    other_world.member.save(update_fields=["is_active"])
    removed = _token_credential(other_world.admin_membership)
    with system_scope():
        Membership.all_tenants.filter(pk=other_world.admin_membership.pk).delete()
    mismatched = StreamCredential(user_id=world.admin.pk, membership_id=world.admin_membership.pk,
                                  token_id=valid.token_id)
    return {"valid": valid, "revoked": revoked, "inactive": inactive, "removed": removed, "mismatched": mismatched}


def test_each_credential_gets_its_own_answer_from_one_query_per_kind(credentials) -> None:
    order = ["valid", "revoked", "inactive", "valid", "removed", "mismatched"]
    with CaptureQueriesContext(connection) as queries:
        answers = credentials_valid_sync([credentials[name] for name in order])
    assert answers == [True, False, False, True, False, False]
    assert len(queries.captured_queries) == 2, [q["sql"] for q in queries.captured_queries]  # memberships, tokens


def test_the_single_check_gives_the_same_answers(credentials) -> None:
    assert {name: stream_guard.credential_valid_sync(c) for name, c in credentials.items()} == {
        "valid": True, "revoked": False, "inactive": False, "removed": False, "mismatched": False}


async def test_rechecks_asked_together_share_one_check(credentials, monkeypatch) -> None:
    monkeypatch.setattr(stream_guard, "CREDENTIAL_BATCH_SECONDS", 0.2)
    batches: list[list[StreamCredential]] = []
    checked = stream_guard.credentials_valid_sync

    def counting(batch):
        batches.append(list(batch))
        return checked(batch)

    monkeypatch.setattr(stream_guard, "credentials_valid_sync", counting)
    names = ["valid", "revoked", "valid", "inactive", "removed", "mismatched", "valid"]
    answers = await asyncio.wait_for(asyncio.gather(*(credential_valid(credentials[n]) for n in names)), 10)
    assert answers == [True, False, True, False, False, False, True]
    assert len(batches) == 1
    assert sorted(batches[0], key=repr) == sorted(credentials.values(), key=repr)  # each credential once


async def test_a_stream_that_stopped_waiting_is_left_out(credentials, monkeypatch) -> None:
    monkeypatch.setattr(stream_guard, "CREDENTIAL_BATCH_SECONDS", 0.2)
    batches: list[list[StreamCredential]] = []
    checked = stream_guard.credentials_valid_sync
    monkeypatch.setattr(stream_guard, "credentials_valid_sync", lambda batch: batches.append(list(batch)) or checked(batch))
    closed = asyncio.ensure_future(credential_valid(credentials["revoked"]))
    kept = asyncio.ensure_future(credential_valid(credentials["valid"]))
    await asyncio.sleep(0)
    closed.cancel()  # the stream closed while its re-check waited
    assert await asyncio.wait_for(kept, 10) is True
    assert batches == [[credentials["valid"]]]


async def test_a_failed_check_fails_every_recheck_it_answers(credentials, monkeypatch) -> None:
    monkeypatch.setattr(stream_guard, "CREDENTIAL_BATCH_SECONDS", 0.1)

    def broken(batch):
        raise ConnectionError("the database is gone")

    monkeypatch.setattr(stream_guard, "credentials_valid_sync", broken)
    results = await asyncio.wait_for(asyncio.gather(credential_valid(credentials["valid"]),
                                                    credential_valid(credentials["revoked"]),
                                                    return_exceptions=True), 10)
    assert [repr(r) for r in results] == [repr(ConnectionError("the database is gone"))] * 2


async def test_a_check_first_asked_for_by_a_request_that_ended_answers_the_others(credentials, monkeypatch) -> None:
    """An SSE stream is a Django request, in a ThreadSensitiveContext with a kept executor
    (agent_platform/request_threads.py). The batch's check must not run in the context of the
    stream that happened to ask first: when that stream had ended before the batch ran, the
    check raised ``RuntimeError: ThreadSensitiveContext has exited`` into every stream it
    answered (15 streams ended with a 1011 or a cut SSE response in a scale-out round)."""
    from agent_platform.request_threads import RequestThreads

    monkeypatch.setattr(stream_guard, "CREDENTIAL_BATCH_SECONDS", 0.2)
    threads = RequestThreads()

    async def a_stream_that_ends_at_once() -> None:
        async with threads.request():
            asked = asyncio.ensure_future(credential_valid(credentials["revoked"]))
            await asyncio.sleep(0)
            asked.cancel()

    await a_stream_that_ends_at_once()
    assert await asyncio.wait_for(credential_valid(credentials["valid"]), 10) is True
