"""Pairing limits (issue 23, L4): one client must not lock everyone behind its address out."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agent_platform.redis_clients import sync_redis as _sync_redis

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture(autouse=True)
def _fresh_counters(settings):
    client = _sync_redis()
    for key in client.scan_iter(f"{settings.REDIS_KEY_PREFIX}:browser:rl:*"):
        client.delete(key)


def _start(client=None, name="Laptop"):
    resp = (client or APIClient()).post("/api/v1/browser/pairings/", {"name": name}, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def _poll(pairing, secret=None):
    return APIClient().post(f"/api/v1/browser/pairings/{pairing['pairing_id']}/token/",
                            {"poll_secret": secret or pairing["poll_secret"]}, format="json")


def test_a_client_guessing_at_pairings_does_not_block_anothers_polls(world, settings):
    settings.BROWSER_PAIRING_POLL_FAILURE_LIMIT = 5
    victim = _start()
    attacker = _start()
    codes = [_poll(attacker, secret=f"guess-{i}").status_code for i in range(8)]
    assert codes[:5] == [404] * 5 and set(codes[5:]) == {429}  # the guesser is stopped
    assert _poll(victim).json() == {"status": "pending"}  # same address, its own pairing still polls
    assert world.client().post("/api/v1/browser/pairings/approve/", {"code": victim["code"]},
                               format="json").status_code == 200
    assert _poll(victim).json()["status"] == "approved"


def test_polls_are_limited_per_pairing(world, settings):
    settings.BROWSER_PAIRING_POLL_RATE_LIMIT = 3
    one, two = _start(), _start()
    assert [_poll(one).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert _poll(two).status_code == 200  # another pairing behind the same address is not blocked


def test_wrong_codes_are_limited_per_user_and_do_not_block_other_users(world, settings):
    settings.BROWSER_PAIRING_APPROVE_RATE_LIMIT = 3
    pairing = _start()
    member, admin = world.client(), world.client(admin=True)
    codes = [member.post("/api/v1/browser/pairings/approve/", {"code": "AAAA-AAAA"}, format="json").status_code
             for _ in range(4)]
    assert codes == [404, 404, 404, 429]
    resp = member.post("/api/v1/browser/pairings/approve/", {"code": pairing["code"]}, format="json")
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0  # even the right code, for this user
    # another user (same tenant, same address) approves with the right code
    assert admin.post("/api/v1/browser/pairings/approve/", {"code": pairing["code"]}, format="json").status_code == 200


def test_a_pairing_flood_blocks_its_address_for_a_minute_at_most(world, settings):
    settings.BROWSER_PAIRING_RATE_LIMIT = 2
    _start()
    _start()
    resp = APIClient().post("/api/v1/browser/pairings/", {}, format="json")
    assert resp.status_code == 429 and 0 < int(resp["Retry-After"]) <= 60
    ttl = _sync_redis().ttl(f"{settings.REDIS_KEY_PREFIX}:browser:rl:pair:127.0.0.1")
    assert 0 < ttl <= 60
