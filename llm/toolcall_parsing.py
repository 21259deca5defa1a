"""Tool calls written as text, for models without native tool-call output (route switch
``tool_calls="text"``).

Three pieces, all pure Python:

* :func:`render_tools_prompt` and :func:`messages_for_text_mode`: what such a model is sent
  instead of ``tools``: Qwen/Hermes-style instructions appended to the system prompt, and a
  history where earlier tool calls are ``<tool_call>`` blocks in assistant text and tool
  results are ``<tool_response>`` blocks in user messages.
* :class:`ToolCallHoldback`: a streaming filter. It releases answer text as it arrives and
  holds back anything that may be a tool call, so raw tool-call JSON is never streamed to the
  user as answer text.
* :func:`parse_tool_calls`: the same recogniser over a whole text.

Recognised forms (one or several per reply, with plain text before or after):

* Hermes/Qwen tags: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (anywhere;
  the closing tag may be missing at the very end of the reply);
* a Markdown code fence labelled ``json`` (or unlabelled) holding such an object;
* a bare object ``{"name": ..., "arguments": {...}}`` starting a line;
* a JSON list of such objects starting a line.

``"parameters"`` is accepted for ``"arguments"``, arguments may be a JSON *string*, and the
OpenAI shape ``{"type": "function", "function": {"name": ..., "arguments": ...}}`` works too.
Outside tags an object counts as a call only when it has a ``"name"`` that looks like a
function name and no keys other than ``name``/``arguments``/``parameters``/``id``/``type``,
so ordinary JSON in an answer (``{"name": "Ada", "born": 1815}``) stays text. Malformed JSON
stays text. Calls get fresh ids ``call_<12 hex>``.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Sequence
from typing import Any, Final

from llm.types import ChatMessage, ToolCallRequest, ToolSpec

TOOL_CALL_OPEN: Final[str] = "<tool_call>"
TOOL_CALL_CLOSE: Final[str] = "</tool_call>"
FENCE: Final[str] = "```"

_JSON_FENCE_LABELS: Final[frozenset[str]] = frozenset({"", "json", "jsonc", "json5", "tool_call", "tool_calls"})
_CALL_KEYS: Final[frozenset[str]] = frozenset({"name", "arguments", "parameters", "id", "type"})
_WRAPPED_CALL_KEYS: Final[frozenset[str]] = frozenset({"function", "id", "type", "index"})
_NAME_RE: Final[re.Pattern[str]] = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_HSPACE: Final[str] = " \t"

_DECODER: Final[json.JSONDecoder] = json.JSONDecoder()


def mint_call_id() -> str:
    """A fresh tool-call id, ``call_`` followed by 12 lowercase hex digits."""
    return f"call_{secrets.token_hex(6)}"


# --- Prompt and history for text mode ------------------------------------------------------


def render_tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """Tool instructions in the Qwen2.5/Hermes format, to append to the system prompt.

    Args:
        tools: The offered tools; one JSON line each inside ``<tools>``.

    Returns:
        The instructions (starting with ``# Tools``), or ``""`` when ``tools`` is empty.
    """
    if not tools:
        return ""
    lines = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


def render_tool_call(call: ToolCallRequest) -> str:
    """One call as a ``<tool_call>`` block (arguments embedded as an object when they parse)."""
    arguments: Any
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        arguments = call.arguments
    body = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def render_tool_response(content: str) -> str:
    """One tool result as a ``<tool_response>`` block."""
    return f"<tool_response>\n{content}\n</tool_response>"


def render_tool_choice_note(tool_choice: str) -> str:
    """The sentence that tells a text-mode model its reply must be a call (its reply is
    constrained to one as well: :func:`llm.providers.openai_compat.build_request`).

    Args:
        tool_choice: ``"required"``, a tool's name, or anything else (``"auto"``: no note).

    Returns:
        The note, or ``""``.

    Measured on Qwen2.5-Coder-0.5B-Instruct (constrained to a ``knowledge_search`` call):
    without a note it wrote an unrelated query, or copied the parameter's description, in
    6 of 6 questions ("What is the latest news about technology trends?"); with this note
    after the tools, 3 of 4 queries were the user's question or close to it.
    """
    if tool_choice in ("auto", "none", ""):
        return ""
    target = "one of the functions" if tool_choice == "required" else tool_choice
    return f"You must call {target} now. Use the words of the user's last message as its arguments."


TOOL_RESULTS_FOLLOW_UP = "Now answer my question in plain text using these results, unless you need another tool."
"""Appended after the ``<tool_response>`` blocks of a text-mode history.

Measured on Qwen2.5-Coder-0.5B-Instruct (shared/LOCAL-MODEL.md machine): given only the
``<tool_response>`` the model never answered in text (it repeated the call or echoed the
result); with an explicit "answer now in plain text" sentence after it, it answered 16 of 16
times.
"""


def messages_for_text_mode(
    messages: Iterable[ChatMessage], tools: Sequence[ToolSpec], *, tool_choice: str = "auto",
) -> list[ChatMessage]:
    """The canonical history rewritten for a model that writes tool calls as text.

    * The tools prompt (:func:`render_tools_prompt`) is appended to the first system message,
      or becomes a new system message at the front when there is none (nothing is added when
      ``tools`` is empty); a ``tool_choice`` that forces a call adds
      :func:`render_tool_choice_note` after it.
    * Assistant messages with ``tool_calls`` become plain assistant text: the content, then one
      ``<tool_call>`` block per call.
    * Tool results become user messages of ``<tool_response>`` blocks; consecutive results are
      merged into one user message, as the Qwen chat template does, followed by
      :data:`TOOL_RESULTS_FOLLOW_UP`.

    Args:
        messages: Canonical history (not modified).
        tools: Tools offered in this request.
        tool_choice: ``"required"`` or a tool's name when the reply must be a call (the
            caller constrains it); else ``"auto"``.

    Returns:
        New messages with roles ``system``/``user``/``assistant`` only and no ``tool_calls``.
    """
    out: list[ChatMessage] = []
    pending_results: list[str] = []

    def flush_results() -> None:
        if pending_results:
            out.append(ChatMessage(role="user", content="\n".join([*pending_results, TOOL_RESULTS_FOLLOW_UP])))
            pending_results.clear()

    for message in messages:
        if message.role == "tool":
            pending_results.append(render_tool_response(message.content))
            continue
        flush_results()
        if message.role == "assistant" and message.tool_calls:
            parts = [message.content] if message.content else []
            parts.extend(render_tool_call(c) for c in message.tool_calls)
            out.append(ChatMessage(role="assistant", content="\n".join(parts)))
        else:
            out.append(ChatMessage(role=message.role, content=message.content, images=message.images))
    flush_results()

    prompt = render_tools_prompt(tools)
    note = render_tool_choice_note(tool_choice) if tools else ""
    if note:
        prompt = f"{prompt}\n\n{note}"
    if prompt:
        for i, message in enumerate(out):
            if message.role == "system":
                joined = f"{message.content}\n\n{prompt}" if message.content else prompt
                out[i] = ChatMessage(role="system", content=joined)
                break
        else:
            out.insert(0, ChatMessage(role="system", content=prompt))
    return out


# --- Recognising calls ---------------------------------------------------------------------


def _arguments_text(value: Any) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value if value.strip() else "{}"
    return json.dumps(value, ensure_ascii=False)


def _call_from_object(obj: Any, *, strict: bool) -> ToolCallRequest | None:
    """A call from one decoded JSON value, or None when it is not call-shaped."""
    if not isinstance(obj, dict):
        return None
    function = obj.get("function")
    if isinstance(function, dict):
        if strict and not set(obj) <= _WRAPPED_CALL_KEYS:
            return None
        obj = function
    elif strict and not set(obj) <= _CALL_KEYS:
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        return None
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    return ToolCallRequest(id=mint_call_id(), name=name, arguments=_arguments_text(arguments))


def calls_from_json_text(text: str, *, strict: bool = True) -> list[ToolCallRequest] | None:
    """Tool calls from text holding one or more JSON values (objects or lists of objects).

    All-or-nothing: every value must be call-shaped.

    Args:
        text: E.g. the inside of a ``<tool_call>`` tag or a fence, or a bare object.
        strict: Reject objects with keys other than the call keys (used outside tags).

    Returns:
        The calls (at least one), or None when the text is not entirely tool calls.
    """
    values: list[Any] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos >= end:
            break
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        values.append(value)
    calls: list[ToolCallRequest] = []
    for value in values:
        items = value if isinstance(value, list) else [value]
        if not items:
            return None
        for item in items:
            call = _call_from_object(item, strict=strict)
            if call is None:
                return None
            calls.append(call)
    return calls or None


# --- Streaming holdback --------------------------------------------------------------------

_PASS, _JSON, _FENCE_OPEN, _FENCE_HOLD, _FENCE_PASS, _TAG = range(6)


class ToolCallHoldback:
    """Streaming filter that separates answer text from tool calls written as text.

    Feed it the model's text deltas; it returns the text that can be shown now. It holds back
    from a ``<tool_call>`` tag (anywhere), or from a code fence, ``{`` or ``[{`` that starts a
    line (after optional spaces), until it knows whether that is a tool call: a tag until
    ``</tool_call>``, a ``json``/unlabelled fence until it closes, a JSON value until its
    brackets balance. A block that turns out not to be a call is released as text; fences
    with another label (``python``…) pass through line by line. Whitespace is released only
    together with the text after it. :meth:`finish` flushes the rest and returns every call.

    Concatenating everything :meth:`feed` and :meth:`finish` returned gives exactly
    :func:`parse_tool_calls`'s text for the same input.

    Not thread-safe; one instance per model call.
    """

    __slots__ = ("_buf", "_mode", "_line_start", "_ws", "_scan", "_depth", "_in_str", "_esc", "_calls", "_done")

    def __init__(self) -> None:
        self._buf = ""
        self._mode = _PASS
        self._line_start = True
        """Whether ``_buf[0]`` starts a line (PASS and FENCE_PASS modes)."""
        self._ws = ""
        """Whitespace released only when non-whitespace text follows."""
        self._scan = 0
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._calls: list[ToolCallRequest] = []
        self._done = False

    @property
    def calls(self) -> list[ToolCallRequest]:
        """The calls recognised so far (a copy)."""
        return list(self._calls)

    @property
    def holding(self) -> bool:
        """True while some text is held back (a possible tool call or pending whitespace)."""
        return bool(self._buf or self._ws)

    def feed(self, text: str) -> str:
        """Add a text delta.

        Args:
            text: The next fragment of the model's output.

        Returns:
            Text that is certainly not part of a tool call, to stream now (maybe ``""``).

        Raises:
            RuntimeError: after :meth:`finish`.
        """
        if self._done:
            raise RuntimeError("ToolCallHoldback.feed() after finish()")
        if not text:
            return ""
        self._buf += text
        out: list[str] = []
        self._run(out, final=False)
        return "".join(out)

    def finish(self) -> tuple[str, list[ToolCallRequest]]:
        """End of the stream: resolve what is held.

        Returns:
            ``(text, calls)``: the remaining text to stream (unfinished blocks that were not
            tool calls; trailing whitespace is dropped when there are calls) and all calls
            recognised over the whole stream, in order.
        """
        if self._done:
            return "", list(self._calls)
        out: list[str] = []
        self._run(out, final=True)
        if self._buf:  # pragma: no cover - _run(final=True) always drains
            self._emit(out, self._buf)
            self._buf = ""
        if not self._calls:
            out.append(self._ws)
        self._ws = ""
        self._done = True
        return "".join(out), list(self._calls)

    # -- internals --

    def _emit(self, out: list[str], text: str) -> None:
        if not text or self._calls:
            # Text after the first tool call is dropped: the model wrote it before seeing any
            # result (typically an invented answer). vLLM's Hermes tool parser does the same:
            # content is the text before the first call.
            return
        body = text.rstrip()
        if body:
            out.append(self._ws)
            out.append(body)
            self._ws = text[len(body) :]
        else:
            self._ws += text

    def _switch(self, mode: int, *, line_start: bool = False) -> None:
        self._mode = mode
        self._line_start = line_start
        self._scan = 0
        self._depth = 0
        self._in_str = False
        self._esc = False

    def _resolve(self, out: list[str], segment: str, calls: list[ToolCallRequest] | None) -> None:
        if calls:
            self._calls.extend(calls)
        else:
            self._emit(out, segment)

    def _run(self, out: list[str], *, final: bool) -> None:
        # Each step either consumes input, switches mode, or returns (waiting for more text).
        while self._buf:
            mode = self._mode
            if mode == _PASS:
                if not self._step_pass(out, final=final):
                    return
            elif mode == _JSON:
                if not self._step_json(out, final=final):
                    return
            elif mode == _FENCE_OPEN:
                if not self._step_fence_open(out, final=final):
                    return
            elif mode == _FENCE_HOLD:
                if not self._step_fence_hold(out, final=final):
                    return
            elif mode == _FENCE_PASS:
                if not self._step_fence_pass(out, final=final):
                    return
            else:
                if not self._step_tag(out, final=final):
                    return

    def _line_trigger(self, buf: str, start: int) -> tuple[int, int] | None:
        """Classify a line start at ``start``: ``(kind, pos)`` with kind 1 = trigger at pos,
        2 = undecided (needs more text); None when the line cannot start a call."""
        j = start
        n = len(buf)
        while j < n and buf[j] in _HSPACE:
            j += 1
        if j >= n:
            return (2, j)
        ch = buf[j]
        if ch == "{":
            return (1, j)
        if ch == "[":
            k = j + 1
            while k < n and buf[k] in " \t\r\n":
                k += 1
            if k >= n:
                return (2, j)
            return (1, j) if buf[k] == "{" else None
        if ch == "`":
            if buf.startswith(FENCE, j):
                return (1, j)
            if FENCE.startswith(buf[j:]):
                return (2, j)
        return None

    def _step_pass(self, out: list[str], *, final: bool) -> bool:
        buf = self._buf
        n = len(buf)
        best: tuple[int, int, int] | None = None  # (position, kind, emit_until)
        tag = buf.find(TOOL_CALL_OPEN)
        if tag >= 0:
            best = (tag, 1, tag)
        # Line starts, earliest first, stopping at the tag if any.
        limit = tag if tag >= 0 else n
        starts = [0] if self._line_start else []
        pos = buf.find("\n")
        while pos >= 0 and pos + 1 <= limit:
            starts.append(pos + 1)
            pos = buf.find("\n", pos + 1)
        for start in starts:
            if start > limit:
                break
            found = self._line_trigger(buf, start)
            if found is not None:
                kind, at = found
                if best is None or start < best[0]:
                    best = (start, kind, at)
                break
        # A partial "<tool_call>" at the very end.
        lt = buf.rfind("<")
        if lt >= 0 and (best is None or lt < best[0]) and TOOL_CALL_OPEN.startswith(buf[lt:]) and n - lt < len(
            TOOL_CALL_OPEN
        ):
            best = (lt, 2, lt)

        if best is None:
            self._emit(out, buf)
            self._line_start = buf.endswith("\n")
            self._buf = ""
            return False
        start, kind, at = best
        if kind == 2 and not final:
            # Wait for more text. What stays buffered starts a line (after its indentation,
            # which is emitted) unless it is a partial "<tool_call>".
            is_tag = buf.startswith("<", at) and at == start and TOOL_CALL_OPEN.startswith(buf[at:])
            self._emit(out, buf[:at])
            self._buf = buf[at:]
            self._line_start = not is_tag
            return False
        if kind == 2:  # final: the undecided tail is text
            self._emit(out, buf)
            self._buf = ""
            return False
        self._emit(out, buf[:at])
        rest = buf[at:]
        self._buf = rest
        if rest.startswith(TOOL_CALL_OPEN):
            self._switch(_TAG)
        elif rest.startswith(FENCE):
            self._switch(_FENCE_OPEN)
        else:
            self._switch(_JSON)
        return True

    def _step_json(self, out: list[str], *, final: bool) -> bool:
        buf = self._buf
        n = len(buf)
        i = self._scan
        if i == 0:
            # Quick rejection: an object must open with a key (or be empty).
            if buf[0] == "{":
                k = 1
                while k < n and buf[k] in " \t\r\n":
                    k += 1
                if k < n and buf[k] not in '"}':
                    return self._release_json_prefix(out, 1)
        depth, in_str, esc = self._depth, self._in_str, self._esc
        while i < n:
            ch = buf[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    segment = buf[: i + 1]
                    self._buf = buf[i + 1 :]
                    self._resolve(out, segment, calls_from_json_text(segment))
                    self._switch(_PASS, line_start=False)
                    return True
            i += 1
        self._scan, self._depth, self._in_str, self._esc = i, depth, in_str, esc
        if final:
            self._emit(out, buf)
            self._buf = ""
        return False

    def _release_json_prefix(self, out: list[str], count: int) -> bool:
        self._emit(out, self._buf[:count])
        self._buf = self._buf[count:]
        self._switch(_PASS, line_start=False)
        return True

    def _step_fence_open(self, out: list[str], *, final: bool) -> bool:
        buf = self._buf
        nl = buf.find("\n")
        if nl < 0:
            if not final:
                return False
            self._emit(out, buf)
            self._buf = ""
            return False
        label = buf[len(FENCE) : nl].strip().lower()
        if label in _JSON_FENCE_LABELS:
            self._switch(_FENCE_HOLD)
            self._scan = nl + 1
            return True
        self._emit(out, buf[: nl + 1])
        self._buf = buf[nl + 1 :]
        self._switch(_FENCE_PASS, line_start=True)
        return True

    def _step_fence_hold(self, out: list[str], *, final: bool) -> bool:
        buf = self._buf
        body_start = buf.find("\n") + 1
        close = buf.find(FENCE, max(self._scan, body_start))
        if close < 0:
            self._scan = max(body_start, len(buf) - len(FENCE) + 1)
            if not final:
                return False
            self._resolve(out, buf, calls_from_json_text(buf[body_start:]))
            self._buf = ""
            return False
        segment = buf[: close + len(FENCE)]
        self._buf = buf[close + len(FENCE) :]
        self._resolve(out, segment, calls_from_json_text(buf[body_start:close]))
        self._switch(_PASS, line_start=False)
        return True

    def _step_fence_pass(self, out: list[str], *, final: bool) -> bool:
        buf = self._buf
        n = len(buf)
        starts = [0] if self._line_start else []
        pos = buf.find("\n")
        while pos >= 0:
            starts.append(pos + 1)
            pos = buf.find("\n", pos + 1)
        for start in starts:
            j = start
            while j < n and buf[j] in _HSPACE:
                j += 1
            if buf.startswith(FENCE, j):
                self._emit(out, buf[: j + len(FENCE)])
                self._buf = buf[j + len(FENCE) :]
                self._switch(_PASS, line_start=False)
                return True
            if not final and (j >= n or FENCE.startswith(buf[j:])):
                # Possibly the closing fence, still arriving.
                self._emit(out, buf[:start])
                self._buf = buf[start:]
                self._line_start = True
                return False
        self._emit(out, buf)
        self._buf = ""
        self._line_start = buf.endswith("\n")
        return False

    def _step_tag(self, out: list[str], *, final: bool) -> bool:
        buf = self._buf
        close = buf.find(TOOL_CALL_CLOSE, max(self._scan, len(TOOL_CALL_OPEN)))
        if close < 0:
            self._scan = max(len(TOOL_CALL_OPEN), len(buf) - len(TOOL_CALL_CLOSE) + 1)
            if not final:
                return False
            # The model may stop without the closing tag.
            self._resolve(out, buf, calls_from_json_text(buf[len(TOOL_CALL_OPEN) :], strict=False))
            self._buf = ""
            return False
        segment = buf[: close + len(TOOL_CALL_CLOSE)]
        self._buf = buf[close + len(TOOL_CALL_CLOSE) :]
        self._resolve(out, segment, calls_from_json_text(buf[len(TOOL_CALL_OPEN) : close], strict=False))
        self._switch(_PASS, line_start=False)
        return True


def parse_tool_calls(text: str) -> tuple[str, list[ToolCallRequest]]:
    """Split a model's whole reply into plain text and the tool calls written in it.

    Same recogniser as :class:`ToolCallHoldback` (see the module docstring for the forms).

    Args:
        text: The reply text.

    Returns:
        ``(remaining_text, calls)``: the text with the call blocks removed (trailing
        whitespace dropped when there are calls; otherwise the text is returned unchanged
        apart from nothing), and the calls in order with fresh ``call_<12 hex>`` ids.
    """
    holdback = ToolCallHoldback()
    head = holdback.feed(text)
    tail, calls = holdback.finish()
    return head + tail, calls


__all__ = [
    "ToolCallHoldback",
    "calls_from_json_text",
    "messages_for_text_mode",
    "mint_call_id",
    "parse_tool_calls",
    "render_tool_call",
    "render_tool_choice_note",
    "render_tool_response",
    "render_tools_prompt",
]
