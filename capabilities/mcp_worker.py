"""Where a worker makes MCP requests that are not part of a run (the chat app's MCP prompts:
:mod:`capabilities.commands.worker`): on the loop the worker's runs use, so the requests share
its MCP pool (warm sessions, cached listings) with them.

The run engine (``sessions``, above this package) registers that loop with
:func:`mcp_loop_register` when its app is ready. Without it (a process without the run
engine) each request runs on a fresh event loop whose pool is closed at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LoopRunner = Callable[[Coroutine[Any, Any, Any]], Any]
"""``runner(coro)``: run ``coro`` to its end on the worker's MCP loop and return its result
(called from a worker thread, never from that loop)."""

_runner: LoopRunner | None = None


def mcp_loop_register(runner: LoopRunner | None) -> None:
    """Make ``runner`` the loop :func:`mcp_loop_run` uses (None: a fresh loop per request)."""
    global _runner
    _runner = runner


def mcp_loop_run(make: Callable[[], Awaitable[T]]) -> T:
    """Run ``make()`` on the worker's MCP loop (see the module docstring) and return its result.

    Call from a thread without a running event loop (a Celery worker's thread). Exceptions of
    the coroutine are raised here.
    """
    if _runner is not None:
        return _runner(_wrap(make))

    async def fresh() -> T:
        from capabilities.mcp.pool import mcp_pool

        try:
            return await make()
        finally:
            await mcp_pool().aclose()

    return asyncio.run(fresh())


async def _wrap(make: Callable[[], Awaitable[T]]) -> T:
    return await make()
