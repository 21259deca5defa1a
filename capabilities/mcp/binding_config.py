"""An ``mcp_server`` binding's own settings (``CapabilityBinding.config``): the lowest level of
the server's log messages kept in the run trace, how long a person has to answer the server's
questions (MCP *elicitation*), and whether (and how) the server may ask the agent's model for a
completion (MCP *sampling*).

Shape (every key optional)::

    {"log_level": "warning", "elicitation_timeout_seconds": 600,
     "sampling": {"allowed": false, "require_approval": false, "allow_tools": false, "max_tokens": 1024}}

- ``log_level``: one of the MCP (RFC 5424 syslog) levels :data:`LOG_LEVELS`; messages below
  it are not asked for (``logging/setLevel`` or the 2026-07-28 per-request opt-in) and dropped
  if they come anyway. Default ``warning``.
- ``elicitation_timeout_seconds``: how long the run's user has to answer the server's request
  for input (an Approval of kind ``elicitation``: its ``expires_at``); unanswered by then, the
  server gets ``decline`` (:func:`sessions.runs.approvals.approvals_expire`) and the run goes
  on. A whole number of seconds from 1 to :data:`MAX_ELICITATION_TIMEOUT_SECONDS`; unset: the
  ``APPROVAL_TTL_SECONDS`` setting (24 h by default).
- ``sampling.allowed``: the server's ``sampling/createMessage`` runs through the agent's model
  route (default false: refused with an MCP error).
- ``sampling.allow_tools``: a sampling request may offer the model the server's tools
  (``tools``/``toolChoice``); without it such a request is refused.
- ``sampling.max_tokens``: the most output tokens one sampling request may ask for (a request
  asking more gets this many); default :data:`DEFAULT_SAMPLING_MAX_TOKENS`, at most
  :data:`MAX_SAMPLING_MAX_TOKENS`.
- ``sampling.require_approval``: each sampling request asks a person first (the run's user, as
  a tool call's approval does: an Approval of kind ``sampling``); the run pauses durably while
  it waits. Approved, the model answers the request; denied (or nobody answered in time), the
  server gets an MCP error saying the user declined (2025-11-25), or the call fails with that
  reason (2026-07-28, which cannot refuse one request). See :mod:`capabilities.mcp.sampling`.
  Default false.

No Django imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""The MCP logging levels, least severe first (RFC 5424 section 6.2.1's severities)."""

DEFAULT_LOG_LEVEL = "warning"
DEFAULT_SAMPLING_MAX_TOKENS = 1024
MAX_SAMPLING_MAX_TOKENS = 32_000

MAX_ELICITATION_TIMEOUT_SECONDS = 7 * 24 * 3600
"""The longest ``elicitation_timeout_seconds`` (a week, in seconds): a server's call is not
kept waiting for an answer longer than that."""

_KEYS = ("log_level", "elicitation_timeout_seconds", "sampling")

_SAMPLING_KEYS = {"allowed", "require_approval", "allow_tools", "max_tokens"}


@dataclass(frozen=True, slots=True)
class SamplingPolicy:
    """What one binding lets its server's sampling requests do."""

    allowed: bool = False
    """The server may sample the agent's model."""
    allow_tools: bool = False
    """A sampling request may offer the model tools (the server runs them itself)."""
    require_approval: bool = False
    """A person approves each request before the model is called."""
    max_tokens: int = DEFAULT_SAMPLING_MAX_TOKENS
    """The cap on one request's output tokens."""


def log_level_rank(level: str) -> int:
    """The level's place in :data:`LOG_LEVELS` (0 = debug); an unknown level ranks as ``info``
    (a server's typo is kept when the binding keeps info and above)."""
    return LOG_LEVELS.index(level) if level in LOG_LEVELS else 1


def binding_config_errors(config: Any) -> list[str]:
    """What is wrong with an ``mcp_server`` binding's ``config`` (``[]``: nothing).

    Args:
        config: The binding's ``config`` (anything: it comes from a form or the API).

    Returns:
        One sentence per problem, naming the key.
    """
    if not isinstance(config, dict):
        return ["config must be a JSON object."]
    errors = [f"Unknown key {key!r} (an MCP server binding takes {', '.join(_KEYS)})."
              for key in config if key not in _KEYS]
    level = config.get("log_level", DEFAULT_LOG_LEVEL)
    if level not in LOG_LEVELS:
        errors.append(f"log_level must be one of {', '.join(LOG_LEVELS)}.")
    timeout = config.get("elicitation_timeout_seconds")
    if timeout is not None and not _whole_number_in(timeout, 1, MAX_ELICITATION_TIMEOUT_SECONDS):
        errors.append("elicitation_timeout_seconds must be a whole number of seconds from 1 to "
                      f"{MAX_ELICITATION_TIMEOUT_SECONDS} (a week), or absent for the default.")
    return errors + _sampling_errors(config.get("sampling", {}))


def _whole_number_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _sampling_errors(sampling: Any) -> list[str]:
    if not isinstance(sampling, dict):
        return ['sampling must be an object such as {"allowed": true}.']
    errors = [f"Unknown sampling key {key!r}." for key in sampling if key not in _SAMPLING_KEYS]
    errors += [f"sampling.{key} must be true or false." for key in ("allowed", "require_approval", "allow_tools")
               if key in sampling and not isinstance(sampling[key], bool)]
    cap = sampling.get("max_tokens")
    if cap is not None and not _whole_number_in(cap, 1, MAX_SAMPLING_MAX_TOKENS):
        errors.append(f"sampling.max_tokens must be a whole number from 1 to {MAX_SAMPLING_MAX_TOKENS}.")
    return errors


def log_level_of(config: Any) -> str:
    """The binding's minimum log level (:data:`DEFAULT_LOG_LEVEL` when unset or invalid)."""
    level = config.get("log_level") if isinstance(config, dict) else None
    return level if level in LOG_LEVELS else DEFAULT_LOG_LEVEL


def elicitation_timeout_of(config: Any) -> int | None:
    """The binding's ``elicitation_timeout_seconds`` (seconds), or None when unset or invalid
    (the ``APPROVAL_TTL_SECONDS`` setting applies)."""
    timeout = config.get("elicitation_timeout_seconds") if isinstance(config, dict) else None
    return timeout if _whole_number_in(timeout, 1, MAX_ELICITATION_TIMEOUT_SECONDS) else None


def sampling_policy_of(config: Any) -> SamplingPolicy:
    """The binding's :class:`SamplingPolicy` (refusing everything when unset or invalid)."""
    sampling = config.get("sampling") if isinstance(config, dict) else None
    if not isinstance(sampling, dict) or _sampling_errors(sampling):
        return SamplingPolicy()
    return SamplingPolicy(
        allowed=sampling.get("allowed") is True, allow_tools=sampling.get("allow_tools") is True,
        require_approval=sampling.get("require_approval") is True,
        max_tokens=sampling.get("max_tokens") or DEFAULT_SAMPLING_MAX_TOKENS,
    )
