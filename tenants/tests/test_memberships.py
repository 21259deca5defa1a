"""Memberships (issue 23, H2): a membership's user never changes, tenant admins see and add
only their tenant's users, users of other tenants join by invitation, and a user lands in the
tenant they picked last."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Role
from tenants.selectors import api_token_authenticate, membership_for_user
from tenants.services import membership_create, tenant_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]


def _console(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _session_client(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


# --- the attack: re-pointing a membership ------------------------------------------------------


def test_console_membership_add_form_lists_only_the_admins_tenant_users(world, other_world):
    html = _console(world.admin).get("/admin/tenants/membership/add/").content.decode()
    assert f">{world.member.username}<" in html
    assert other_world.member.username not in html and other_world.admin.username not in html


def test_console_cannot_repoint_a_membership_to_another_tenants_user(world, other_world):
    membership = world.member_membership
    token = ApiToken.all_tenants.filter(membership=membership).first()
    resp = _console(world.admin).post(f"/admin/tenants/membership/{membership.pk}/change/",
                                      {"user": other_world.member.pk, "role": "member"})
    assert resp.status_code in (200, 302)
    membership.refresh_from_db()
    assert membership.user_id == world.member.pk
    # the victim does not land in the attacker's tenant, and the token still is the member's
    assert membership_for_user(user=other_world.member).tenant_id == other_world.tenant.pk
    assert api_token_authenticate(raw=world.member_token).membership.user_id == world.member.pk
    assert token is not None


def test_console_cannot_add_a_membership_for_another_tenants_user(world, other_world):
    resp = _console(world.admin).post("/admin/tenants/membership/add/",
                                      {"user": other_world.member.pk, "role": "member"})
    assert resp.status_code == 200  # the form again, with an error
    assert not Membership.all_tenants.filter(tenant=world.tenant, user=other_world.member).exists()


def test_console_adds_a_new_user_to_the_tenant(world):
    resp = _console(world.admin).post("/admin/tenants/membership/add/", {
        "new_username": "fresh-hire", "new_password": "a-long-password-1", "role": "member"})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    user = get_user_model().objects.get(username="fresh-hire")
    assert user.check_password("a-long-password-1")
    assert Membership.all_tenants.get(user=user).tenant_id == world.tenant.pk
    event = AuditEvent.all_tenants.filter(tenant=world.tenant, object_type="tenants.membership", action="create",
                                          source="console").get()
    assert event.changes["new_password"] == {"changed": True}
    assert "a-long-password-1" not in str(event.changes) + str(event.detail)


def test_the_model_refuses_to_change_a_memberships_user_or_tenant(world, other_world):
    membership = Membership.all_tenants.get(pk=world.member_membership.pk)
    membership.user = other_world.member
    with pytest.raises(ValidationError):
        membership.save()
    with pytest.raises(ValidationError):
        membership.full_clean()
    stray = Membership(pk=world.member_membership.pk, tenant=other_world.tenant, user=world.member, role="member")
    with pytest.raises(ValidationError):
        stray.save()
    assert Membership.all_tenants.get(pk=membership.pk).user_id == world.member.pk
    membership = Membership.all_tenants.get(pk=world.member_membership.pk)
    membership.role = Role.ADMIN
    membership.save()  # the role may change


def test_console_cannot_move_a_token_to_another_membership(world):
    token = ApiToken.all_tenants.filter(membership=world.member_membership).first()
    _console(world.admin).post(f"/admin/tenants/apitoken/{token.pk}/change/",
                               {"membership": world.admin_membership.pk, "name": "x"})
    token.refresh_from_db()
    assert token.membership_id == world.member_membership.pk


# --- invitations -------------------------------------------------------------------------------


def _invite(world, **body):
    return world.client(admin=True).post("/api/v1/admin/invitations/", body, format="json")


def test_a_user_of_another_tenant_joins_by_accepting_an_invitation(world, other_world):
    resp = _invite(world, username=other_world.member.username, role="member")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["token"].startswith("inv_") and body["state"] == "pending"
    assert Invitation.all_tenants.get(pk=body["id"]).token_hash != body["token"]

    # someone else cannot use it
    wrong = _session_client(other_world.admin).post("/api/v1/invitations/accept/", {"token": body["token"]},
                                                    format="json")
    assert wrong.status_code == 403 and wrong.json() == {"message": "This invitation is for another user.",
                                                         "extra": {}}
    # the invited user (a member of globex) accepts it
    resp = _session_client(other_world.member).post("/api/v1/invitations/accept/", {"token": body["token"]},
                                                    format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["tenant"]["slug"] == "acme" and resp.json()["role"] == "member"
    assert Membership.all_tenants.filter(tenant=world.tenant, user=other_world.member, role="member").exists()
    # only once
    again = _session_client(other_world.member).post("/api/v1/invitations/accept/", {"token": body["token"]},
                                                     format="json")
    assert again.status_code == 404
    assert AuditEvent.all_tenants.filter(tenant=world.tenant, action="invitation_accepted").count() == 1
    assert AuditEvent.all_tenants.filter(tenant=world.tenant, action="invitation_created").count() == 1


def test_invitation_by_email_and_expiry(world, other_world):
    other_world.member.email = "Pat@Example.com"
    other_world.member.save()
    resp = _invite(world, email="pat@example.com", role="admin")
    assert resp.status_code == 201, resp.content
    token = resp.json()["token"]
    Invitation.all_tenants.filter(pk=resp.json()["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = _session_client(other_world.member).post("/api/v1/invitations/accept/", {"token": token}, format="json")
    assert expired.status_code == 404
    Invitation.all_tenants.filter(pk=resp.json()["id"]).update(expires_at=timezone.now() + timedelta(hours=1))
    ok = _session_client(other_world.member).post("/api/v1/invitations/accept/", {"token": token}, format="json")
    assert ok.status_code == 201 and ok.json()["role"] == "admin"


def test_invitation_rules(world, other_world):
    assert _invite(world, username=world.member.username).status_code == 409  # already a member
    assert _invite(world).status_code == 400  # names nobody
    assert _invite(world, username="x", role="owner").status_code == 403  # admins do not make owners
    assert world.client().post("/api/v1/admin/invitations/", {"username": "x"}, format="json").status_code == 403
    resp = _invite(world, username="someone")
    # another tenant's admin neither sees nor revokes it
    listed = other_world.client(admin=True).get("/api/v1/admin/invitations/").json()
    assert listed["results"] == []
    gone = other_world.client(admin=True).delete(f"/api/v1/admin/invitations/{resp.json()['id']}/")
    assert gone.status_code == 404
    assert world.client(admin=True).delete(f"/api/v1/admin/invitations/{resp.json()['id']}/").status_code == 204
    assert Invitation.all_tenants.get(pk=resp.json()["id"]).state == "revoked"
    bogus = _session_client(other_world.member).post("/api/v1/invitations/accept/", {"token": "inv_nope"},
                                                     format="json")
    assert bogus.status_code == 404


def test_console_invitation_shows_the_token_once(world):
    resp = _console(world.admin).post("/admin/tenants/invitation/add/", {"username": "newcomer", "role": "member"},
                                      follow=True)
    assert resp.status_code == 200
    assert "inv_" in resp.content.decode()
    invitation = Invitation.all_tenants.get(tenant=world.tenant, username="newcomer")
    assert invitation.created_by_id == world.admin.pk and invitation.state == "pending"
    assert AuditEvent.all_tenants.filter(object_type="tenants.invitation", object_id=str(invitation.pk)).count() == 1


# --- where a user lands ------------------------------------------------------------------------


def test_a_user_lands_in_the_tenant_they_picked_last(world, other_world):
    user = other_world.member
    third = tenant_create(name="Initech", slug="initech")
    membership_create(tenant=world.tenant, user=user)  # newer than the globex membership
    membership_create(tenant=third, user=user)
    client = APIClient()
    login = client.post("/api/v1/auth/login/", {"username": user.username, "password": "pw-user-123"},
                        format="json")
    assert login.json()["tenant"]["slug"] == "globex"  # nothing picked yet: the oldest

    me = client.get("/api/v1/auth/me/", HTTP_X_TENANT="acme")
    assert me.json()["tenant"]["slug"] == "acme"
    assert client.get("/api/v1/auth/me/").json()["tenant"]["slug"] == "acme"  # remembered
    client.post("/api/v1/auth/logout/")
    login = client.post("/api/v1/auth/login/", {"username": user.username, "password": "pw-user-123"},
                        format="json")
    assert login.json()["tenant"]["slug"] == "acme"

    picked = client.post("/api/v1/auth/tenant/", {"tenant": "initech"}, format="json")
    assert picked.status_code == 200 and picked.json()["tenant"]["slug"] == "initech"
    tenants = client.get("/api/v1/auth/tenants/").json()
    assert [t["slug"] for t in tenants][0] == "initech" and tenants[0]["default"] is True
    assert sorted(t["slug"] for t in tenants) == ["acme", "globex", "initech"]
    assert client.post("/api/v1/auth/tenant/", {"tenant": "nowhere"}, format="json").status_code == 404
    client.post("/api/v1/auth/logout/")
    login = client.post("/api/v1/auth/login/", {"username": user.username, "password": "pw-user-123"},
                        format="json")
    assert login.json()["tenant"]["slug"] == "initech"


# --- the membership API ------------------------------------------------------------------------


def test_api_refuses_to_repoint_a_membership_and_changes_roles(world, other_world):
    admin = world.client(admin=True)
    url = f"/api/v1/admin/memberships/{world.member_membership.pk}/"
    assert world.client().get("/api/v1/admin/memberships/").status_code == 403  # members may not
    resp = admin.patch(url, {"user": other_world.member.pk, "role": "member"}, format="json")
    assert resp.status_code == 400 and resp.json()["extra"] == {"fields": {"user": ["Read-only."]}}
    assert Membership.all_tenants.get(pk=world.member_membership.pk).user_id == world.member.pk

    resp = admin.patch(url, {"role": "admin"}, format="json")
    assert resp.status_code == 200 and resp.json()["role"] == "admin"
    assert resp.json()["user"] == {"id": world.member.pk, "username": world.member.username}
    [event] = AuditEvent.all_tenants.filter(tenant=world.tenant, object_type="tenants.membership", action="update")
    assert event.changes == {"role": {"from": "member", "to": "admin"}} and event.source == "api"

    assert admin.patch(url, {"role": "owner"}, format="json").status_code == 403  # admins do not make owners
    listed = admin.get("/api/v1/admin/memberships/").json()
    assert {m["user"]["username"] for m in listed["results"]} == {world.admin.username, world.member.username}
    # another tenant's membership is not there
    assert admin.get(f"/api/v1/admin/memberships/{other_world.member_membership.pk}/").status_code == 404
    assert admin.delete(f"/api/v1/admin/memberships/{other_world.member_membership.pk}/").status_code == 404
    assert admin.delete(url).status_code == 204
    assert not Membership.all_tenants.filter(pk=world.member_membership.pk).exists()
    assert api_token_authenticate(raw=world.member_token) is None  # its tokens went with it


def test_owners_are_changed_by_owners_only_and_the_last_one_stays(world):
    owner_membership = Membership.all_tenants.get(pk=world.admin_membership.pk)
    owner_membership.role = Role.OWNER
    owner_membership.save()
    owner = world.client(admin=True)  # acme-admin is now the owner
    member_url = f"/api/v1/admin/memberships/{world.member_membership.pk}/"
    assert owner.patch(member_url, {"role": "owner"}, format="json").status_code == 200  # an owner makes owners
    assert owner.patch(f"/api/v1/admin/memberships/{owner_membership.pk}/", {"role": "member"},
                       format="json").status_code == 200
    last = world.client()  # acme-user: now the only owner
    resp = last.patch(member_url, {"role": "admin"}, format="json")
    assert resp.status_code == 409 and resp.json()["message"] == "A tenant keeps at least one owner."
    assert last.delete(member_url).status_code == 409


def test_console_admins_do_not_make_or_touch_owners(world):
    resp = _console(world.admin).post(f"/admin/tenants/membership/{world.member_membership.pk}/change/",
                                      {"role": "owner"})
    assert resp.status_code == 200  # the form again: "owner" is not a choice for an admin
    assert Membership.all_tenants.get(pk=world.member_membership.pk).role == Role.MEMBER
    Membership.all_tenants.filter(pk=world.member_membership.pk).update(role=Role.OWNER)
    console = _console(world.admin)
    assert console.post(f"/admin/tenants/membership/{world.member_membership.pk}/change/",
                        {"role": "member"}).status_code == 403
    assert console.post(f"/admin/tenants/membership/{world.member_membership.pk}/delete/",
                        {"post": "yes"}).status_code == 403
    assert Membership.all_tenants.get(pk=world.member_membership.pk).role == Role.OWNER
