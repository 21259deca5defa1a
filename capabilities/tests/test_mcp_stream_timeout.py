"""A pooled MCP session that nobody uses is closed by the pool before its stream's read timeout
ends it (issue 37: a quiet legacy-SSE session hit the 300 s read timeout, an ERROR traceback,
just before the pool's 300 s idle close; with a longer idle setting it always died first)."""

from __future__ import annotations

from capabilities.mcp import transport


def test_the_streams_stay_open_longer_than_the_pools_idle_close(settings):
    for idle in (30.0, 300.0, 900.0, 3600.0):
        settings.MCP_POOL_IDLE_TIMEOUT_SECONDS = idle
        assert transport.stream_read_timeout_seconds() >= idle + 60.0
        assert transport.stream_read_timeout_seconds() >= 300.0  # never shorter than the SDK's default
