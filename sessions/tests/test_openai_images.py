"""Image parts on the OpenAI-compatible API (the Open Responses "image input" case), with the
official `openai` SDK as the client: a `data:` URL image in the last user message is stored as an
artifact of the run's chat and referenced in the message, as the chat app's attachments are; a
route entry that takes images gets it with the message. Other URLs, other types and images in
earlier messages are a 400 naming the field."""

from __future__ import annotations

import base64

import openai
import openresponses_types as ort
import pytest

from agents.tests.factories import agent_with_route
from llm.models import ModelRouteEntry
from llm.testing import Reply
from sessions.models import Artifact, Message, Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("all_tenants_scope")]

# A 1×1 red PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def sdk(live_server_url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server_url}/api/openai/v1", api_key=token, max_retries=0, timeout=30)


def seeing_agent(world, fake_llm):
    agent = agent_with_route(tenant=world.tenant, base_urls=[fake_llm.base_url], name="Viewer")
    ModelRouteEntry.all_tenants.filter(route=agent.route).update(supports_images=True)
    return agent


def image_urls(request: dict) -> list[str]:
    content = request["messages"][-1]["content"]
    return [p["image_url"]["url"] for p in content if p.get("type") == "image_url"] if isinstance(content, list) else []


def test_a_chat_completion_with_an_image_part(world, fake_llm, celery_worker, live_server_url):
    seeing_agent(world, fake_llm)
    fake_llm.script(Reply("A red dot."))
    answer = sdk(live_server_url, world.member_token).chat.completions.create(model="viewer", messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
                                     {"type": "image_url", "image_url": {"url": DATA_URL}}]}])
    assert answer.choices[0].message.content == "A red dot."
    assert image_urls(fake_llm.requests[0]) == [DATA_URL]
    artifact = Artifact.all_tenants.get()
    assert (artifact.mime_type, artifact.size_bytes, artifact.name) == ("image/png", len(PNG), "image-1.png")
    run = Run.all_tenants.get()
    assert run.input.startswith("What is in this image?\n[image: artifact:") and artifact.session_id == run.session_id
    assert Message.all_tenants.get(run=run, role="user").content == run.input


def test_responses_input_image(world, fake_llm, celery_worker, live_server_url):
    seeing_agent(world, fake_llm)
    fake_llm.script(Reply("A red dot."))
    response = sdk(live_server_url, world.member_token).responses.create(model="viewer", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Describe it."},
                                     {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}]}])
    assert response.status == "completed" and response.output_text == "A red dot."
    ort.ResponseResource.model_validate(response.model_dump())
    assert image_urls(fake_llm.requests[0]) == [DATA_URL]


@pytest.mark.parametrize(("content", "param"), [
    ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}], "messages[0].content[0].image_url.url"),
    ([{"type": "image_url", "image_url": {"url": "data:image/svg+xml;base64,PHN2Zy8+"}}],
     "messages[0].content[0].image_url.url"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,***"}}], "messages[0].content[0].image_url.url"),
])
def test_bad_images_are_a_400_naming_the_part(world, live_server_url, content, param):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Viewer")
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(live_server_url, world.member_token).chat.completions.create(
            model="viewer", messages=[{"role": "user", "content": content}])
    assert caught.value.param == param, caught.value.body
    assert not Run.all_tenants.exists()


def test_an_image_in_an_earlier_message_is_a_400(world, live_server_url):
    agent_with_route(tenant=world.tenant, base_urls=["http://127.0.0.1:9/v1"], name="Viewer")
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(live_server_url, world.member_token).chat.completions.create(model="viewer", messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA_URL}}]},
            {"role": "assistant", "content": "A dot."}, {"role": "user", "content": "And?"}])
    assert caught.value.param == "messages[0].content[0]" and "last user message" in caught.value.message
