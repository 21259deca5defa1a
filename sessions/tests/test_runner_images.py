"""Images attached in the chat reach route entries that take images (issue 25): uploaded through
the attachments API, posted as a message with the reference, and run; the fake model servers
record what each entry received."""

from __future__ import annotations

import base64

import pytest
from channels.db import database_sync_to_async
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from agents.tests.factories import agent_with_route
from llm.models import ModelProvider, ModelRouteEntry
from llm.testing import Fail, Reply
from llm.testing_anthropic import FakeAnthropicServer
from sessions.runner.loop import execute_run
from sessions.services import chat_session_create, message_post
from sessions.tests.conftest import reload_run
from tenants.scoping import tenant_scope

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("no_enqueue"),
    pytest.mark.usefixtures("all_tenants_scope"),
]

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
GIF = b"GIF89a" + b"\x01" * 40


@database_sync_to_async
def chat_with_images(world, urls, *, images_on: tuple[bool, ...], files, anthropic_at=(), user=None,
                     typed="What is in these?", read_timeout_seconds=5.0):
    """A chat of ``user`` (the member) with an agent whose route has one entry per URL
    (``supports_images`` per ``images_on``), the files uploaded through the API, and a message
    posted with their references as the chat app sends it. Returns (run, uploaded rows)."""
    agent = agent_with_route(tenant=world.tenant, base_urls=urls, read_timeout_seconds=read_timeout_seconds)
    with tenant_scope(world.tenant.pk):
        for entry, on in zip(ModelRouteEntry.objects.filter(route=agent.route).order_by("position"), images_on,
                             strict=True):
            ModelRouteEntry.objects.filter(pk=entry.pk).update(supports_images=on)
            if entry.position in anthropic_at:
                ModelProvider.objects.filter(pk=entry.provider_id).update(api="anthropic")
        session = chat_session_create(user=user or world.member, agent=agent)
    client = world.client()
    uploaded = client.post(f"/api/v1/sessions/{session.pk}/attachments/",
                           {"file": [SimpleUploadedFile(name, data, content_type=mime) for name, data, mime in files]},
                           format="multipart")
    assert uploaded.status_code == 201, uploaded.content
    rows = uploaded.json()
    content = "\n\n".join(r["reference"] for r in rows) + f"\n\n{typed}"
    with tenant_scope(world.tenant.pk):
        run = message_post(session=session, user=user or world.member, content=content)
    return run, rows, content


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def test_an_entry_with_images_gets_them_and_a_fallback_without_gets_the_reference(
        world, fake_llm, second_fake_llm):
    fake_llm.script(Fail(500))
    second_fake_llm.script(Reply("A picture of something."))
    run, rows, content = await chat_with_images(
        world, [fake_llm.base_url, second_fake_llm.base_url], images_on=(True, False),
        files=[("a.png", PNG, "image/png"), ("b.gif", GIF, "image/gif")],
    )
    await execute_run(run.pk)
    assert (await reload_run(run.pk)).status == "completed"
    user_message = fake_llm.requests[0]["messages"][-1]
    assert user_message == {"role": "user", "content": [
        {"type": "text", "text": content},
        {"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}},
        {"type": "image_url", "image_url": {"url": data_url("image/gif", GIF)}},
    ]}
    assert content.startswith(f'[image: artifact:{rows[0]["id"]} "a.png", image/png, 72 B]')
    # the fallback entry takes no images: the same message as text, references included
    assert second_fake_llm.requests[0]["messages"][-1] == {"role": "user", "content": content}


async def test_an_anthropic_entry_gets_base64_image_blocks(world, fake_llm):
    with FakeAnthropicServer() as claude:
        claude.script(Reply("A PNG."))
        run, _rows, content = await chat_with_images(
            world, [claude.base_url], images_on=(True,), anthropic_at=(0,), files=[("a.png", PNG, "image/png")],
            read_timeout_seconds=30.0,  # a first Anthropic request in a run took 5-10 s on the loaded test machine
        )
        await execute_run(run.pk)
        body = claude.requests[0]
    assert (await reload_run(run.pk)).reply == "A PNG."
    assert body["messages"][-1] == {"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(PNG).decode()}},
        {"type": "text", "text": content},
    ]}


async def test_a_route_without_image_entries_sends_the_text_alone(world, fake_llm):
    fake_llm.script(Reply("I read the reference."))
    run, _rows, content = await chat_with_images(world, [fake_llm.base_url], images_on=(False,),
                                                 files=[("a.png", PNG, "image/png")])
    await execute_run(run.pk)
    assert fake_llm.requests[0]["messages"][-1] == {"role": "user", "content": content}


@override_settings(CHAT_IMAGE_MAX_BYTES=64)
async def test_too_large_or_unsupported_images_go_as_a_reference_with_a_note(world, fake_llm):
    fake_llm.script(Reply("Noted."))
    small_gif = b"GIF89a" + b"\x02" * 10
    run, rows, content = await chat_with_images(
        world, [fake_llm.base_url], images_on=(True,),
        files=[("big.png", PNG, "image/png"), ("v.svg", b"<svg/>", "image/svg+xml"), ("s.gif", small_gif, "image/gif")],
    )
    await execute_run(run.pk)
    parts = fake_llm.requests[0]["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"]
    assert parts[1]["image_url"]["url"] == data_url("image/gif", small_gif)
    text = parts[0]["text"]
    big, svg, gif = (f'[image: artifact:{r["id"]} ' for r in rows)
    assert f'{big}"big.png", image/png, 72 B] (not shown to you: larger than the 64 B limit for images' in text
    assert f'{svg}"v.svg", image/svg+xml, 6 B] (not shown to you: image/svg+xml is not an image type' in text
    assert f'{gif}"s.gif", image/gif, 16 B]\n' in text  # sent: no note


async def test_a_reference_to_another_chat_s_image_stays_text(world, fake_llm):
    """A reference typed by hand to an artifact of another chat (here: another user's) is not
    resolved: only the run's own session's artifacts are attached."""
    fake_llm.script(Reply("first"), Reply("second"))
    other_run, other_rows, _ = await chat_with_images(world, [fake_llm.base_url], images_on=(True,),
                                                      files=[("secret.png", PNG, "image/png")])
    await execute_run(other_run.pk)
    forged = f'[image: artifact:{other_rows[0]["id"]} "secret.png", image/png, 72 B]\n\nDescribe it.'

    @database_sync_to_async
    def post_forged():
        agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url])
        ModelRouteEntry.all_tenants.filter(route=agent.route).update(supports_images=True)
        with tenant_scope(world.tenant.pk):
            session = chat_session_create(user=world.admin, agent=agent)
            return message_post(session=session, user=world.admin, content=forged)

    run = await post_forged()
    await execute_run(run.pk)
    assert fake_llm.requests[1]["messages"][-1] == {"role": "user", "content": forged}
