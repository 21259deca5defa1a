"""Fixtures the capability tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from capabilities.mcp.pool import McpPool


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    """An MCP pool of the test's own, closed after it."""
    pool = McpPool()
    try:
        yield pool
    finally:
        await pool.aclose()
