"""Pairing and device endpoints (API level, real PostgreSQL and Redis)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from browser.models import BrowserDevice, BrowserPairing
from browser.selectors import browser_device_authenticate

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def start_pairing(name="Laptop Chrome"):
    resp = APIClient().post("/api/v1/browser/pairings/", {"name": name}, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def poll(pairing):
    return APIClient().post(f"/api/v1/browser/pairings/{pairing['pairing_id']}/token/",
                            {"poll_secret": pairing["poll_secret"]}, format="json")


def test_pairing_end_to_end_issues_a_hashed_token_once(world):
    pairing = start_pairing()
    assert len(pairing["code"]) == 9 and pairing["code"][4] == "-"
    assert poll(pairing).json() == {"status": "pending"}

    resp = world.client().post("/api/v1/browser/pairings/approve/", {"code": pairing["code"].lower()}, format="json")
    assert resp.status_code == 200, resp.content

    answer = poll(pairing).json()
    assert answer["status"] == "approved" and answer["token"].startswith("apd_")
    assert answer["user"]["username"] == world.member.username and answer["tenant"]["slug"] == "acme"
    device = BrowserDevice.all_tenants.get(pk=answer["device"]["id"])
    assert device.tenant_id == world.tenant.pk and device.user_id == world.member.pk
    assert answer["token"] not in device.token_hash and len(device.token_hash) == 64
    assert browser_device_authenticate(raw=answer["token"]).pk == device.pk

    again = poll(pairing)  # the token is handed out once
    assert again.status_code == 404 and "token" not in again.json()


def test_wrong_poll_secret_and_unknown_code_are_404(world):
    pairing = start_pairing()
    resp = APIClient().post(f"/api/v1/browser/pairings/{pairing['pairing_id']}/token/",
                            {"poll_secret": "guess"}, format="json")
    assert resp.status_code == 404
    resp = world.client().post("/api/v1/browser/pairings/approve/", {"code": "AAAA-AAAA"}, format="json")
    assert resp.status_code == 404 and "expired" in resp.json()["message"]


def test_expired_pairing_cannot_be_approved(world):
    pairing = start_pairing()
    BrowserPairing.objects.filter(pk=pairing["pairing_id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    resp = world.client().post("/api/v1/browser/pairings/approve/", {"code": pairing["code"]}, format="json")
    assert resp.status_code == 404
    assert poll(pairing).status_code == 404


def test_approving_needs_a_logged_in_member(world):
    pairing = start_pairing()
    resp = APIClient().post("/api/v1/browser/pairings/approve/", {"code": pairing["code"]}, format="json")
    assert resp.status_code in (401, 403)


def test_bad_input_is_a_400_with_message(world):
    resp = world.client().post("/api/v1/browser/pairings/approve/", {}, format="json")
    assert resp.status_code == 400 and set(resp.json()) == {"message", "extra"}


def test_devices_listed_and_revoked(world):
    pairing = start_pairing()
    world.client().post("/api/v1/browser/pairings/approve/", {"code": pairing["code"]}, format="json")
    token = poll(pairing).json()["token"]
    listed = world.client().get("/api/v1/browser/devices/").json()["results"]
    assert [d["name"] for d in listed] == ["Laptop Chrome"] and listed[0]["connected"] is False
    device_id = listed[0]["id"]
    assert world.client(admin=True).get("/api/v1/browser/devices/").json()["results"] == []  # another user's
    assert world.client(admin=True).delete(f"/api/v1/browser/devices/{device_id}/").status_code == 404
    assert world.client().delete(f"/api/v1/browser/devices/{device_id}/").status_code == 204
    assert browser_device_authenticate(raw=token) is None
    assert world.client().get(f"/api/v1/browser/devices/{device_id}/").json()["revoked_at"] is not None


def test_pairing_creation_is_rate_limited(world, settings):
    settings.BROWSER_PAIRING_RATE_LIMIT = 2
    from agent_platform.redis_clients import sync_redis as _sync_redis

    for key in _sync_redis().scan_iter(f"{settings.REDIS_KEY_PREFIX}:browser:rl:*"):
        _sync_redis().delete(key)
    start_pairing()
    start_pairing()
    resp = APIClient().post("/api/v1/browser/pairings/", {}, format="json")
    assert resp.status_code == 429 and resp.json()["message"].startswith("Too many requests")
