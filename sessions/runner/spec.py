"""What a run needs, loaded once from the database at the start of (each attempt of) a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from capabilities.cli.tool import CliCommandConfig
from capabilities.mcp.client import McpServerConfig
from llm.config import RouteEntryConfig


@dataclass(frozen=True, slots=True)
class McpBindingSpec:
    server: McpServerConfig
    allowed_tools: frozenset[str]
    """Empty: every tool the server lists."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()
    """``[{pattern, action}]`` rules (agents.models.approval_action)."""
    server_id: int = 0
    """``McpServer`` primary key: with the tenant and ``server.fingerprint``, the MCP pool key."""


@dataclass(frozen=True, slots=True)
class BuiltinBindingSpec:
    name: str
    """The registered built-in tool name."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()
    config: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BrowserBindingSpec:
    """A ``browser`` binding: the browser tools, on the extension or the server backend."""

    config: dict = field(default_factory=dict)
    """``{backend, fallback_to_server, allowed_origins, blocked_origins}`` (browser.tools.BrowserConfig)."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class CliBindingSpec:
    command: CliCommandConfig
    """The command: template, schema, limits, sandbox flags and its decrypted env."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()
    """``[{pattern, action}]`` rules (agents.models.approval_action)."""


@dataclass(frozen=True, slots=True)
class SkillBindingSpec:
    skill_id: int
    name: str
    """The skill's name: the tool name asked for (before collision renaming)."""
    description: str
    allowed_tools: tuple[str, ...] = ()
    """Patterns (fnmatch) over the calling run's exposed tool names; empty: no tools."""
    binding_id: int | None = None
    approval_policy: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RunSpec:
    run_id: int
    tenant_id: int
    session_id: int
    user_id: int
    agent_name: str
    system_prompt: str
    max_loop_count: int
    tool_max_parallel: int
    tool_timeout_seconds: float
    turn_timeout_seconds: float
    """Longest one model turn (retries and fallbacks included) may take."""
    max_tokens_per_run: int | None
    """Budget: prompt + completion tokens of the whole run; None: no limit."""
    max_cost_per_run_usd_micros: int | None
    """Budget: micro-USD of the whole run; None: no limit."""
    tenant_monthly_budget_usd_micros: int | None
    """Budget: micro-USD of the tenant's LLM calls this calendar month (UTC); None: no limit."""
    entries: tuple[RouteEntryConfig, ...]
    entry_ids: tuple[int, ...]
    """ModelRouteEntry primary keys, parallel to ``entries``."""
    mcp_bindings: tuple[McpBindingSpec, ...] = ()
    builtin_bindings: tuple[BuiltinBindingSpec, ...] = ()
    browser_bindings: tuple[BrowserBindingSpec, ...] = ()
    cli_bindings: tuple[CliBindingSpec, ...] = ()
    skill_bindings: tuple[SkillBindingSpec, ...] = ()
    depth: int = 0
    """0 for a user's run; a sub-run's is its parent's + 1 (``sessions.runner.subrun``)."""
    parent_run_id: int | None = None
    """Sub-runs: the run whose tool call this one answers."""
    user_run_id: int | None = None
    """Sub-runs: the user's run (depth 0) at the top of the tree. Approvals asked inside a
    sub-run belong to it: it is the run that pauses and resumes. None for a user's run."""
    attempt: int = 1
    loop_count: int = 0
    """Model turns already taken (non-zero when resuming)."""
    run_timeout_seconds: float = 1800.0
    steer: bool = False
    """The agent's message_mode is ``steer``: messages sent meanwhile join this run between turns."""
    run_started_at: float = 0.0
    """Unix time the run first started."""
    run_paused_seconds: float = 0.0
    """Time spent waiting for approvals so far (not counted by the run timeout)."""

    @property
    def waiting_run_id(self) -> int:
        """The run that pauses while a tool call of this one waits for a human: the user's run."""
        return self.user_run_id if self.user_run_id is not None else self.run_id

    def run_seconds_left(self, now: float) -> float:
        """Seconds the run may still work (≤ 0: its run timeout has passed). ``now``: Unix time."""
        return self.run_started_at + self.run_paused_seconds + self.run_timeout_seconds - now
