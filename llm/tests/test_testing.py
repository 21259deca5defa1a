"""FakeLLMServer itself: sync use, other processes, non-streaming answers, shutdown."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from llm.testing import NO_STEP_LEFT, CutAfter, Delay, Fail, FakeLLMServer, Hang, Reply, ToolCalls

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("all_tenants_scope")]


def _post(server: FakeLLMServer, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5, **kwargs)


def test_models_endpoint_and_base_url() -> None:
    with FakeLLMServer(model="tiny") as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        response = httpx.get(f"{server.base_url}/models", timeout=5)

    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == ["tiny"]


def test_no_scripted_step_left_is_a_loud_500() -> None:
    with FakeLLMServer() as server:
        response = _post(server, {"model": "m", "messages": []})

    assert response.status_code == 500
    assert response.json()["error"]["message"] == NO_STEP_LEFT


def test_sync_openai_client_non_streaming() -> None:
    with FakeLLMServer() as server:
        server.script(Reply("hello", reasoning="hm"), ToolCalls([("f", {"x": 1})], text="calling"))
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        second = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        client.close()

    assert first.choices[0].message.content == "hello"
    assert first.usage is not None and first.usage.completion_tokens > 0
    call = second.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("f", {"x": 1})
    assert second.choices[0].finish_reason == "tool_calls"


def test_sync_openai_client_streaming_with_usage() -> None:
    with FakeLLMServer() as server:
        server.script(Reply("abcdefgh", chunk_size=2))
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
            )
        )
        client.close()

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "abcdefgh"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_fail_sends_status_headers_and_body() -> None:
    with FakeLLMServer() as server:
        server.script(Fail(429, headers={"Retry-After": "3"}), Fail(400, body={"error": {"message": "nope"}}))
        limited = _post(server, {"messages": []})
        bad = _post(server, {"messages": []})

    assert (limited.status_code, limited.headers["retry-after"]) == (429, "3")
    assert bad.json() == {"error": {"message": "nope"}}


def test_requests_are_recorded_in_order() -> None:
    with FakeLLMServer() as server:
        server.script(Reply("a"), Reply("b"))
        _post(server, {"model": "m1", "messages": []})
        _post(server, {"model": "m2", "messages": []})

        assert [r["model"] for r in server.requests] == ["m1", "m2"]
        assert server.pending_steps == 0
        server.clear()
        assert server.requests == []


def test_script_rejects_non_steps() -> None:
    with FakeLLMServer() as server, pytest.raises(TypeError):
        server.script("hello")  # type: ignore[arg-type]


def test_respond_hook_may_be_async() -> None:
    async def answer(body: dict) -> Reply:
        await asyncio.sleep(0)
        return Reply(f"echo {body['messages'][0]['content']}")

    with FakeLLMServer() as server:
        server.respond(answer)
        response = _post(server, {"messages": [{"role": "user", "content": "ping"}]})

    assert response.json()["choices"][0]["message"]["content"] == "echo ping"


def test_cut_after_drops_the_connection() -> None:
    with FakeLLMServer() as server:
        server.script(CutAfter("abcdefgh", n_chunks=1))
        with pytest.raises(httpx.RemoteProtocolError):
            _post(server, {"messages": [], "stream": True}).read()


def test_delay_then_step() -> None:
    with FakeLLMServer() as server:
        server.script(Delay(0.2, Reply("late")))
        started = time.monotonic()
        response = _post(server, {"messages": []})

    assert time.monotonic() - started >= 0.2
    assert response.json()["choices"][0]["message"]["content"] == "late"


def test_hang_does_not_block_shutdown() -> None:
    server = FakeLLMServer().start()
    server.script(Hang(3600))
    errors: list[BaseException] = []

    def call() -> None:
        try:
            _post(server, {"messages": []})
        except httpx.HTTPError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert server.wait_for_requests(1)
    started = time.monotonic()
    server.stop()
    caller.join(5)

    assert time.monotonic() - started < 3
    assert not caller.is_alive() and len(errors) == 1


def test_usable_from_another_process() -> None:
    with FakeLLMServer() as server:
        server.script(Reply("from the parent"))
        code = (
            "import httpx, sys; "
            f"r = httpx.post('{server.base_url}/chat/completions', json={{'messages': []}}, timeout=5); "
            "sys.stdout.write(r.json()['choices'][0]['message']['content'])"
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)

    assert result.stdout == "from the parent"
