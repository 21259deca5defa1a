"""The periodic clean-up (``oauth_server.cleanup``: DOT's clear_expired, dead consents, grants
without tokens, unused registered clients) and the audit events of a consent and a revocation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone
from oauth2_provider.models import get_application_model, get_grant_model, get_refresh_token_model

from oauth_server import tasks
from oauth_server.models import McpGrant
from oauth_server.services import oauth_cleanup
from oauth_server.tests import flow
from tenants.audit import Action
from tenants.models import AuditEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

AGENTS = "http://testserver/mcp/agents/"


def _consent_without_exchange(membership) -> str:
    client = Client()
    client.force_login(membership.user)
    registered = flow.register(client, name="Abandoned")
    params = flow.authorize_params(registered["client_id"], AGENTS, flow.pkce().challenge)
    flow.redirect_query(flow.consent(client, params, membership_id=membership.pk))
    return registered["client_id"]


def test_the_beat_runs_the_cleanup_task():
    entry = settings.CELERY_BEAT_SCHEDULE["oauth-cleanup"]
    assert entry["task"] == tasks.oauth_cleanup.name == "oauth_server.cleanup"


def test_a_consent_never_exchanged_and_its_expired_code_are_deleted_after_the_codes_life(world):
    kept_client, _ = flow.tokens_for(Client(), world.member_membership, resource=AGENTS)
    abandoned = _consent_without_exchange(world.member_membership)
    assert McpGrant.all_tenants.count() == 2
    assert oauth_cleanup(now=timezone.now()) == {"consents": 0, "grants": 0, "clients": 0}  # still in its life
    get_grant_model().objects.update(expires=timezone.now() - timedelta(seconds=1))  # the code expired

    counts = tasks.oauth_cleanup.apply(kwargs={}).get()  # the beat's task, run here

    assert counts["consents"] == 0  # measured from now: the consent is younger than the code life
    counts = oauth_cleanup(now=timezone.now() + timedelta(seconds=61))
    assert counts["consents"] == 1
    assert not get_grant_model().objects.exists()  # DOT's clear_expired took the code
    [left] = McpGrant.all_tenants.all()
    assert left.application.client_id == kept_client
    assert get_application_model().objects.filter(client_id=abandoned).exists()  # young client


def test_a_grant_whose_refresh_tokens_are_all_gone_is_deleted(world):
    flow.tokens_for(Client(), world.member_membership, resource=AGENTS)
    later = timezone.now() + timedelta(seconds=61)
    assert oauth_cleanup(now=later)["grants"] == 0
    get_refresh_token_model().objects.all().delete()  # as clear_expired does once they expired
    assert oauth_cleanup(now=later)["grants"] == 1
    assert not McpGrant.all_tenants.exists()


def test_unused_registered_clients_are_deleted_after_n_days(world, settings):
    settings.OAUTH_UNUSED_CLIENT_DAYS = 30
    application_model = get_application_model()
    used, _ = flow.tokens_for(Client(), world.member_membership, resource=AGENTS)
    unused = flow.register(Client(), name="Never signed in")["client_id"]
    young = flow.register(Client(), name="Just registered")["client_id"]
    manual = application_model.objects.create(
        name="manual",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris=flow.REDIRECT_URI,
    )
    old = timezone.now() - timedelta(days=31)
    application_model.objects.filter(client_id__in=[used, unused]).update(created=old)
    application_model.objects.filter(pk=manual.pk).update(created=old)

    counts = oauth_cleanup()

    assert counts["clients"] == 1
    remaining = set(application_model.objects.values_list("client_id", flat=True))
    assert unused not in remaining
    assert {used, young, manual.client_id} <= remaining
    assert McpGrant.all_tenants.count() == 1  # the used client's grant stays


def test_consent_and_revocation_are_audited(world):
    client_id, _ = flow.tokens_for(Client(), world.member_membership, resource=AGENTS, name="Audited IDE")
    grant = McpGrant.all_tenants.get()
    [given] = AuditEvent.all_tenants.filter(action=Action.OAUTH_CONSENT_GIVEN)
    assert given.tenant_id == world.member_membership.tenant_id
    assert given.actor_id == world.member.pk and given.source == "auth" and given.ip_address == "127.0.0.1"
    assert given.object_type == "oauth_server.mcpgrant" and given.object_id == str(grant.pk)
    assert given.detail["client_id"] == client_id and given.detail["resource"] == AGENTS
    assert given.detail["client_name"] == "Audited IDE"

    assert world.client().delete(f"/api/v1/oauth-grants/{grant.pk}/").status_code == 204

    [revoked] = AuditEvent.all_tenants.filter(action=Action.OAUTH_GRANT_REVOKED)
    assert revoked.tenant_id == world.member_membership.tenant_id
    assert revoked.object_id == str(grant.pk) and revoked.detail["client_id"] == client_id
    assert revoked.actor_id == world.member.pk and revoked.source == "api"
