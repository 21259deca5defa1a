"""Fixtures for the model layer's tests: fake provider servers, and closing pooled clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from llm.providers import anthropic as anthropic_adapter
from llm.providers import openai_compat
from llm.testing import FakeLLMServer


@pytest.fixture
def server_a() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def server_b() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def server_c() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def closed_port_root() -> str:
    """``http://127.0.0.1:<port>`` with nobody listening on the port (connection refused)."""
    from conftest import free_port

    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(autouse=True)
async def _close_pooled_clients() -> AsyncIterator[None]:
    """Each test's pooled SDK clients are closed on its own event loop."""
    yield
    await openai_compat.aclose_clients()
    await anthropic_adapter.aclose_clients()
