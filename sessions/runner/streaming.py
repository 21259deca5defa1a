"""Streaming one model turn to clients: text and reasoning published in batches.

Used by the turn's model step (:func:`sessions.runner.turn.model_turn`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from llm.errors import StreamInterrupted
from llm.router import Router
from llm.types import ChatMessage, Completion, ReasoningDelta, TextDelta, ToolSpec

if TYPE_CHECKING:
    from sessions.runner.ports import Publisher

logger = logging.getLogger(__name__)


TOKEN_FLUSH_SECONDS = 0.025
"""Streamed text is published at most this long after it arrived (25 ms: half the 50 ms
token-to-client target), and at most once per this interval per run while it keeps coming:
a run streaming 100 tokens/s costs ~40 events/s instead of 100."""
TOKEN_FLUSH_CHARS = 512


class StreamedTextBatcher:
    """Batches a turn's streamed text into ``content_token``/``reasoning_token`` events.

    A throttle with a trailing timer: text that arrives after a quiet interval (nothing
    published for :data:`TOKEN_FLUSH_SECONDS`) is published at once, so the first token and a
    slow model's tokens are never held; text that arrives sooner waits until that interval
    has passed since the last publish, on a timer, so a pause in the stream never holds text
    back. :data:`TOKEN_FLUSH_CHARS` buffered publish at once.

    A publish does not wait for the previous one to return: :meth:`Publisher.nowait
    <sessions.runner.ports.Publisher.nowait>` queues the event at once (production: on one
    ordered connection, :func:`sessions.events.event_publish_nowait`, so ``seq`` follows the
    stream's order and no task is made per event).
    Waiting for the previous reply used to hold text back by a whole Redis round trip of a
    busy loop (bench/README.md).

    :meth:`close` publishes the rest, waits for every publish and raises the first one's
    error; :meth:`drop` discards what is buffered but lets the publishes in flight finish (a
    broken stream: its ``model_retry`` must come after them); :meth:`abort` also cancels
    them (the turn is cancelled).
    """

    def __init__(self, publish: Publisher) -> None:
        self._loop = asyncio.get_running_loop()
        self._groups: list[tuple[str, list[str]]] = []  # buffered text: (event type, pieces), in order
        self._size = 0
        self._last_publish_at = float("-inf")
        self._timer: asyncio.TimerHandle | None = None
        self._nowait = publish.nowait
        self._inflight: set[asyncio.Future[Any]] = set()
        self._error: BaseException | None = None

    def add(self, event_type: str, text: str) -> None:
        if self._groups and self._groups[-1][0] == event_type:
            self._groups[-1][1].append(text)
        else:
            self._groups.append((event_type, [text]))
        self._size += len(text)
        wait = self._last_publish_at + TOKEN_FLUSH_SECONDS - self._loop.time()
        if self._size >= TOKEN_FLUSH_CHARS or wait <= 0:
            self._flush()
        elif self._timer is None:
            self._timer = self._loop.call_later(wait, self._flush)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush(self) -> None:
        self._stop_timer()
        if not self._groups:
            return
        groups, self._groups, self._size = self._groups, [], 0
        self._last_publish_at = self._loop.time()
        for event_type, pieces in groups:
            data = {"text": "".join(pieces)}
            sent = asyncio.ensure_future(self._nowait(event_type, data))
            self._inflight.add(sent)
            sent.add_done_callback(self._sent)

    def _sent(self, sent: asyncio.Future[Any]) -> None:
        self._inflight.discard(sent)
        if not sent.cancelled() and sent.exception() is not None and self._error is None:
            self._error = sent.exception()

    async def close(self) -> None:
        """Publish everything buffered and wait for it (raises a publish's error; a cancel
        while waiting aborts)."""
        try:
            self._flush()
            if self._inflight:
                await asyncio.wait(set(self._inflight))
        except asyncio.CancelledError:
            self.abort()
            raise
        if self._error is not None:
            raise self._error

    async def drop(self) -> None:
        """Discard the buffered text; wait for the publishes in flight (an error is logged)."""
        self._stop_timer()
        self._groups, self._size = [], 0
        if self._inflight:
            await asyncio.wait(set(self._inflight))
        if self._error is not None:
            logger.warning("publishing streamed text failed: %r", self._error)

    def abort(self) -> None:
        """Stop: nothing more is published (the turn is being cancelled)."""
        self._stop_timer()
        self._groups, self._size = [], 0
        for sent in self._inflight:
            sent.cancel()


async def stream_model_turn(
    router: Router, messages: list[ChatMessage], tool_specs: list[ToolSpec], publish: Publisher, *, compact_first: bool = False,
    tool_choice: str = "auto", response_format: dict[str, Any] | None = None,
) -> tuple[Completion, str]:
    """Stream one model turn, publishing text and reasoning in batches (:class:`StreamedTextBatcher`).

    ``tool_choice`` (:attr:`llm.model.ModelSettings.tool_choice`) is passed to the router
    only when it is not ``"auto"``; ``response_format`` (the run's output format for entries
    with native JSON-schema mode, :attr:`llm.model.ModelSettings.response_format`) only when set.

    Returns:
        The completion, and the reasoning text streamed with it (recorded, never fed back).
    """
    completion: Completion | None = None
    reasoning: list[str] = []
    batcher = StreamedTextBatcher(publish)
    streamed = publish.streamed  # this turn's text, for a run stopped mid-answer
    if streamed is not None:
        streamed.clear()
    try:
        choice: dict[str, Any] = {} if tool_choice == "auto" else {"tool_choice": tool_choice}
        if response_format is not None:
            choice["response_format"] = response_format
        async for event in router.stream(messages, tool_specs, compact_first=compact_first, **choice):
            if isinstance(event, TextDelta):
                batcher.add("content_token", event.text)
                if streamed is not None:
                    streamed.append(event.text)
            elif isinstance(event, ReasoningDelta):
                batcher.add("reasoning_token", event.text)
                reasoning.append(event.text)
            elif isinstance(event, Completion):
                completion = event
    except asyncio.CancelledError:
        batcher.abort()
        raise
    except BaseException:
        await batcher.drop()
        raise
    await batcher.close()
    if completion is None:
        raise StreamInterrupted("the stream ended without a completion")
    if streamed is not None:  # the turn's text is saved with its assistant message from here on
        streamed.clear()
    return completion, "".join(reasoning)
