"""Memories in the console: tenant admins read and delete their tenant's, nobody else reads them
(not members, not other tenants' admins, not a superuser without an admin membership)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from agents.tests.factories import AgentFactory
from memory.models import Memory
from memory.tests.factories import memory_make

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("all_tenants_scope")]

LIST = "/admin/memory/memory/"


@pytest.fixture
def memories(world, other_world):
    ours = memory_make(tenant=world.tenant, user=world.member, agent=AgentFactory(tenant=world.tenant, name="Helper"),
                       text="Prefers answers in French.")
    theirs = memory_make(tenant=other_world.tenant, user=other_world.member, agent=AgentFactory(tenant=other_world.tenant),
                         text="Their secret memory.")
    return ours, theirs


def test_a_tenant_admin_lists_and_deletes_the_tenants_memories(client, world, memories):
    ours, theirs = memories
    client.force_login(world.admin)
    body = client.get(LIST).content.decode()
    assert "Prefers answers in French." in body and "Their secret memory." not in body
    assert client.get(f"{LIST}?agent__id__exact={ours.agent_id}").status_code == 200
    page = client.get(f"{LIST}{ours.pk}/change/")
    assert page.status_code == 200 and 'name="text"' not in page.content.decode()  # shown, not editable
    assert client.get(f"{LIST}add/").status_code == 403
    foreign = client.get(f"{LIST}{theirs.pk}/change/", follow=True)
    assert "Their secret memory." not in foreign.content.decode()
    resp = client.post(f"{LIST}{ours.pk}/delete/", {"post": "yes"})
    assert resp.status_code == 302
    assert not Memory.all_tenants.filter(pk=ours.pk).exists()
    assert client.post(f"{LIST}{theirs.pk}/delete/", {"post": "yes"}).status_code in (302, 403, 404)
    assert Memory.all_tenants.filter(pk=theirs.pk).exists()


def test_members_and_superusers_without_an_admin_membership_see_no_memories(client, world, memories):
    client.force_login(world.member)
    assert "Prefers answers in French." not in client.get(LIST, follow=True).content.decode()
    root = get_user_model().objects.create_superuser(username="root", password="pw-root-123456")
    client.force_login(root)
    resp = client.get(LIST, follow=True)
    assert "Prefers answers in French." not in resp.content.decode()
    assert "Their secret memory." not in resp.content.decode()
