"""Capability kinds as plugins: the one place a kind of capability is known.

A *kind* (MCP server, built-in tool, CLI command, skill, browser, ...) is a
:class:`CapabilityKind` subclass registered once with :func:`kind_register`, in its own
module, imported by its app's ``AppConfig.ready()``. Everything that used to switch on
``CapabilityBinding.kind`` asks the registry instead:

- ``agents.models.CapabilityBinding.clean`` → :meth:`CapabilityKind.validate`;
- the binding serializer and the console's binding form → :attr:`CapabilityKind.fields`
  (which binding columns a kind uses) and :func:`kind_choices`;
- the runner's configuration load (``sessions.runner.adapters.run_spec_load``) → :func:`binding_specs`
  (:meth:`CapabilityKind.spec_key` and :meth:`CapabilityKind.load_spec`);
- the runner's toolset (``sessions.runner.toolset.toolset_open``) →
  :meth:`CapabilityKind.open_toolset`, wrapped by :mod:`capabilities.toolsets`
  (approval policy, exposed names), the same for every kind;
- the run's start (``sessions.runner.run_context``) → :meth:`CapabilityKind.run_context`:
  :class:`ContextBlock` s added to the run's model input after the system prompt
  (retrieved passages, what the agent remembers about the user);
- the run's completion (``sessions.runner.run_context.run_attributions``) →
  :meth:`CapabilityKind.run_completed`: attributions of the answer to what the kind gave the
  run (the knowledge kind matches an uncited answer's sentences to its passages).

A binding spec is the kind's own frozen dataclass; it has at least ``binding_id`` and
``approval_policy`` (the generic wrappers read them) and a ``kind`` class attribute equal to
the kind's key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, ParamSpec, Protocol, TypeAlias, TypeVar

from capabilities.tools import Tool
from capabilities.toolsets import KindToolset

if TYPE_CHECKING:
    from django.db.models import Model

    from llm.config import RouteEntryConfig

P = ParamSpec("P")
R = TypeVar("R")

JSONValue: TypeAlias = "dict[str, JSONValue] | list[JSONValue] | str | int | float | bool | None"
"""A JSON value, as ``json.loads`` returns it."""

BindingRow: TypeAlias = "Model"
"""An ``agents.CapabilityBinding`` row (``agents`` sits above ``capabilities``, so it is named by
its Django base class here): ``kind``, ``tenant_id`` and the columns of :data:`BINDING_FIELDS`."""


class BindingSpec(Protocol):
    """A kind's binding spec, as the generic code reads it: the kind's own frozen dataclass
    (``McpBindingSpec``, ``SkillBindingSpec``, ...) with a ``kind`` class attribute equal to the
    kind's key, the binding's id and its approval rules."""

    @property
    def kind(self) -> str: ...

    @property
    def binding_id(self) -> int | None: ...

    @property
    def approval_policy(self) -> tuple[dict[str, str], ...]:
        """``[{pattern, action}]`` rules (:func:`capabilities.toolsets.approval_action`)."""


class RunInfo(Protocol):
    """What a kind may read of the run it opens tools for (the runner's
    ``sessions.runner.spec.RunSpec`` has it; ``sessions`` sits above, so it is a protocol here)."""

    @property
    def run_id(self) -> int: ...

    @property
    def user_id(self) -> int: ...

    @property
    def entries(self) -> tuple[RouteEntryConfig, ...]:
        """The run's route entries (a kind that asks the run's model uses them)."""

    @property
    def entry_ids(self) -> tuple[int, ...]: ...

    @property
    def purpose(self) -> str:
        """Where the run came from: ``chat``, ``api``, ``evaluation``, ``schedule``, ``webhook``."""

    @property
    def attached_resources(self) -> tuple[dict[str, Any], ...]:
        """MCP resources the person attached to the run's message or pinned to its chat:
        ``[{binding, server_id, server, uri, pinned?}]`` (:mod:`capabilities.mcp.attached`)."""


class InThread(Protocol):
    """``in_thread(fn)(*args, **kwargs)``: ``fn`` run on the run's database thread under its
    tenant scope, awaited (``sessions.runner.threads.db``)."""

    def __call__(self, fn: Callable[P, R], /) -> Callable[P, Awaitable[R]]: ...

BINDING_FIELDS = ("mcp_server", "builtin_name", "cli_command", "skill", "allowed_tools", "approval_policy", "config")
"""The CapabilityBinding columns a kind may use (besides ``agent``, ``kind``, ``enabled``)."""

Publish = Callable[[str, dict[str, Any]], Awaitable[object]]
"""``await publish(event_type, data)``: an event of the run (``data``: its JSON payload)."""


@dataclass(slots=True)
class OpenContext:
    """What a kind may use while opening its toolset for one run (ports filled by the runner).

    Kinds run in the run's event loop and task; connections they open must be entered on
    ``stack`` (closed when the run ends, in the same task).
    """

    tenant_id: int
    run_id: int
    tool_timeout_seconds: float
    """The agent's per-call timeout, in seconds."""
    stack: contextlib.AsyncExitStack
    publish: Publish | None = None
    """The run's event publisher (``capability_unavailable`` and the like); None: log only."""
    in_thread: InThread | None = None
    """``in_thread(fn)(**kwargs)``: run a synchronous ORM function on the run's database
    thread, under the run's tenant scope (``sessions.runner.threads.db``)."""
    subrun_tool: Callable[[BindingSpec, str], Tool] | None = None
    """``subrun_tool(binding_spec, exposed_name)`` → a Tool answered by a sub-run of this run
    over a subset of its tools (skills; sub-agents). Provided by the runner."""
    run: RunInfo | None = None
    """The run's RunSpec (what kinds read of it: :class:`RunInfo`)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Per-run state a kind keeps between :meth:`CapabilityKind.open_toolset` and
    :meth:`CapabilityKind.run_context` (the same OpenContext is passed to both); key it by the
    kind's key. The runner sets ``extra["run_context"]``: the run's start context (a tuple of
    :class:`ContextBlock`), once it is made or, for a resumed run, read back."""
    user_id: int | None = None
    """The run's user (the member who sent the message)."""
    agent_id: int | None = None
    """The run's agent (``agents.AgentInstance`` id)."""
    attach_file: Callable[[str, str, bytes], Awaitable[str]] | None = None
    """``await attach_file(name, mime_type, data)``: store a file as an attachment of the run's
    user message, as the chat app's attachments are (an artifact of the chat, its reference
    line added to the message: images go to route entries that take them); returns the
    reference line. Provided by the runner (None: files cannot be attached)."""
    attended: bool = False
    """A person watches the run (the chat app, not an API door, A2A or agents over MCP): a kind
    may then offer a tool that waits for them (an OAuth MCP server nobody connected gets a
    ``<alias>__connect`` stand-in, :mod:`capabilities.mcp_oauth.runs`). False: leave it out."""


@dataclass(frozen=True, slots=True)
class ContextBlock:
    """Text a kind adds to a run's model input when the run starts, after the system prompt.

    ``source``: the kind's key (``knowledge``, ``memory``); ``title``: a heading for the model
    and the trace ("Passages from the knowledge base ..."); ``text``: the block's body, as the
    model reads it; ``data``: JSON-serialisable details for clients (e.g. ``{"citations":
    [...]}``), never sent to the model; ``untrusted``: the text is outside data (retrieved
    passages of uploaded files and fetched pages), framed like an untrusted tool's result
    when the model reads it (:func:`sessions.runner.run_context.context_system_text`).
    Persisted with the run (``Run.context``), so a resumed run sees the same blocks and the
    trace and the chat app show them.
    """

    source: str
    title: str
    text: str
    data: JSONValue = None
    untrusted: bool = False

    def as_json(self) -> dict[str, Any]:
        """``{source, title, text, data}`` and ``untrusted: true`` when set (how ``Run.context``
        stores it)."""
        stored = {"source": self.source, "title": self.title, "text": self.text, "data": self.data}
        if self.untrusted:
            stored["untrusted"] = True
        return stored

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ContextBlock:
        """The block :meth:`as_json` stored (missing keys: empty)."""
        return cls(source=str(raw.get("source", "")), title=str(raw.get("title", "")),
                   text=str(raw.get("text", "")), data=raw.get("data"), untrusted=raw.get("untrusted") is True)


@dataclass(frozen=True, slots=True)
class ToolResultData:
    """The structured result of one of a run's succeeded tool calls, by the tool's origin."""

    source: str
    """The tool's :class:`~capabilities.toolsets.ToolOrigin` source (``knowledge``, ``mcp``, ...)."""
    name: str
    """The tool's own name at that source (``knowledge_search``)."""
    data: JSONValue
    """The call's ``ToolResult.data`` as stored (JSON), e.g. ``{"citations": [...]}``."""


@dataclass(frozen=True, slots=True)
class RunAnswer:
    """A top-level run's final answer, as :meth:`CapabilityKind.run_completed` sees it."""

    reply: str
    """The answer's text (``Run.reply``; never changed by a kind)."""
    context: tuple[ContextBlock, ...] = ()
    """The run's start context."""
    tool_results: tuple[ToolResultData, ...] = ()
    """The data of the run's succeeded tool calls, in the order they were made."""


class CapabilityKind:
    """A kind of capability: how its bindings are validated, loaded and opened for a run.

    Subclass, set :attr:`key`, :attr:`label`, :attr:`fields`, implement :meth:`load_spec` and
    :meth:`open_toolset` (and :meth:`validate` if the kind checks its binding), then
    ``kind_register(MyKind())`` at the bottom of the module.
    """

    key: ClassVar[str]
    """The ``CapabilityBinding.kind`` value (``mcp_server``, ``builtin``, ...); max 20 characters."""
    label: ClassVar[str]
    """Shown in forms (``MCP server``)."""
    fields: ClassVar[tuple[str, ...]] = ("approval_policy",)
    """The binding columns (of :data:`BINDING_FIELDS`) the kind uses: the console form shows
    only these; the other columns of a binding of this kind must be empty."""
    starts_subruns: ClassVar[bool] = False
    """Its tools run sub-runs (the run's end then takes the careful path)."""
    position: ClassVar[int] = 100
    """Kinds are listed, and their tools offered to the model, by position, then registration."""

    def validate(self, binding: BindingRow) -> dict[str, str | list[str]]:
        """What is wrong with ``binding`` for this kind: ``{field: message(s)}``, ``{}`` if fine.

        Called by ``CapabilityBinding.clean`` after the common checks (agent and tenant,
        allowed tools, approval policy, config is an object). Foreign keys must be checked
        against ``binding.tenant_id``: answer "... not found." for another tenant's row.
        """
        return {}

    def spec_key(self, binding: BindingRow) -> Hashable | None:
        """Bindings of one agent with the same non-None key load once (the first, by id)."""
        return None

    def load_spec(self, binding: BindingRow) -> BindingSpec | None:
        """The binding's spec for a run (a frozen dataclass), or None to leave it out
        (a disabled server, a deleted command). Runs on a thread under the run's tenant scope."""
        raise NotImplementedError

    async def open_toolset(self, specs: Sequence[Any], ctx: OpenContext) -> list[tuple[BindingSpec, KindToolset]]:
        """The tools of this kind's bound ``specs`` (in order) for the run ``ctx``:
        ``[(spec, KindToolset)]``; a spec whose capability is unreachable may be left out."""
        raise NotImplementedError

    async def run_context(self, specs: Sequence[Any], ctx: OpenContext, query: str) -> list[ContextBlock]:
        """Blocks to add to the model input of the run ``ctx`` when it starts (default: none).

        Called by the runner once per run, at its first start (never again when the same run
        resumes: the stored blocks are reused), after :meth:`open_toolset` with the same
        ``ctx``, for the run's bound ``specs`` of this kind; ``query`` is the run's user
        message. Runs in the run's event loop: ORM work goes through ``ctx.in_thread``. An
        exception is logged and the run goes on without this kind's blocks.
        """
        return []

    def run_context_wanted(self, specs: Sequence[Any], run: RunInfo) -> bool:
        """Whether :meth:`run_context` has anything to give ``run`` (default True). A kind
        whose context depends on the run (the MCP kind: only runs with attached resources)
        says no here, and the runner spends no database round trip on it."""
        return True

    @classmethod
    def has_run_context(cls) -> bool:
        """Whether the kind overrides :meth:`run_context` (the runner skips the others
        without a database round trip)."""
        return cls.run_context is not CapabilityKind.run_context

    async def run_completed(self, specs: Sequence[Any], ctx: OpenContext, answer: RunAnswer) -> list[dict[str, Any]] | None:
        """Attributions of a completed run's answer to what this kind gave the run (default: None).

        Called by the runner once, when a top-level run (never a sub-run) has its answer and
        just before it ends ``completed``, for the run's bound ``specs`` of this kind, with the
        ``ctx`` its toolset was opened with; the run waits for the kinds at most
        ``sessions.runner.run_context.ATTRIBUTION_TIMEOUT_SECONDS`` in all. Runs in the run's
        event loop: ORM work goes through ``ctx.in_thread``.

        Returns:
            None: not attempted (nothing to attribute, or the answer cites already); else a
            JSON-serialisable list of ``{sentence_start, sentence_end, n, chunk_id, score}``
            (character offsets in ``answer.reply``), stored as ``Run.attributions`` and sent
            with ``run_completed``. An exception (or the time limit) is logged and nothing
            is stored; the run completes all the same.
        """
        return None

    @classmethod
    def has_run_completed(cls) -> bool:
        """Whether the kind overrides :meth:`run_completed`."""
        return cls.run_completed is not CapabilityKind.run_completed


_KINDS: dict[str, CapabilityKind] = {}


def kind_register(kind: CapabilityKind) -> CapabilityKind:
    """Register ``kind`` under ``kind.key`` (listed by :attr:`CapabilityKind.position`).

    Raises:
        ValueError: another kind already has that key, or ``fields`` names an unknown column.
    """
    existing = _KINDS.get(kind.key)
    if existing is not None and type(existing) is not type(kind):
        raise ValueError(f"capability kind {kind.key!r} registered twice")
    unknown = set(kind.fields) - set(BINDING_FIELDS)
    if unknown:
        raise ValueError(f"capability kind {kind.key!r}: unknown binding fields {sorted(unknown)}")
    _KINDS[kind.key] = kind
    ordered = sorted(_KINDS.values(), key=lambda k: k.position)  # stable: registration order breaks ties
    _KINDS.clear()
    _KINDS.update((k.key, k) for k in ordered)
    return kind


def kind_unregister(key: str) -> None:
    """Remove the kind ``key`` (tests that register a kind of their own)."""
    _KINDS.pop(key, None)


def kind_get(key: str) -> CapabilityKind | None:
    """The registered kind ``key``, or None."""
    return _KINDS.get(key)


def kinds() -> list[CapabilityKind]:
    """Every registered kind, by position."""
    return list(_KINDS.values())


def kind_choices() -> list[tuple[str, str]]:
    """``[(key, label)]`` of every registered kind (the binding's ``kind`` choices)."""
    return [(k.key, k.label) for k in _KINDS.values()]


def kind_fields() -> dict[str, list[str]]:
    """``{key: [binding fields it uses]}`` (the console form shows only the chosen kind's)."""
    return {k.key: list(k.fields) for k in _KINDS.values()}


def binding_specs(bindings: Sequence[BindingRow]) -> tuple[BindingSpec, ...]:
    """The specs of an agent's enabled ``bindings`` (ordered by id), for a run.

    Bindings of an unknown kind are skipped; so are those whose kind's :meth:`spec_key`
    repeats an earlier one's, and those whose :meth:`load_spec` returns None. Runs on a
    thread under the run's tenant scope (kinds may read rows).

    Returns:
        The specs, grouped by kind (by position), by binding id within a kind.
    """
    seen: set[tuple[str, Hashable]] = set()
    by_kind: dict[str, list[BindingSpec]] = {}
    for binding in bindings:
        kind = _KINDS.get(binding.kind)
        if kind is None:
            continue
        key = kind.spec_key(binding)
        if key is not None and (kind.key, key) in seen:
            continue
        spec = kind.load_spec(binding)
        if spec is None:
            continue
        if key is not None:
            seen.add((kind.key, key))
        by_kind.setdefault(kind.key, []).append(spec)
    return tuple(spec for key in _KINDS if key in by_kind for spec in by_kind[key])


def specs_of(specs: Sequence[BindingSpec], key: str) -> tuple[BindingSpec, ...]:
    """The specs of kind ``key`` among ``specs``."""
    return tuple(s for s in specs if s.kind == key)
