"""A memory binding's configuration (``CapabilityBinding.config`` of kind ``memory``).

``{"retention_days": 365, "max_items": 5, "extract_after_idle_minutes": 30}``; every key is
optional (the defaults below). An agent with an enabled ``memory`` binding has memory on;
without one, off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEY = "memory"
"""The capability kind's key (``CapabilityBinding.kind``): here so that the selectors, which
find an agent's binding, need not import the kind (:mod:`memory.kind`), which calls the services."""

DEFAULT_RETENTION_DAYS = 365
DEFAULT_MAX_ITEMS = 5
DEFAULT_EXTRACT_AFTER_IDLE_MINUTES = 30

LIMITS: dict[str, tuple[int, int]] = {
    "retention_days": (1, 3650),
    "max_items": (1, 20),
    "extract_after_idle_minutes": (1, 7 * 24 * 60),
}
"""Allowed range (inclusive) of each key."""


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """What a memory binding decides."""

    retention_days: int = DEFAULT_RETENTION_DAYS
    """A memory not updated for this many days is deleted (days of 24 h)."""
    max_items: int = DEFAULT_MAX_ITEMS
    """Memories given to a run at its start (the most relevant to its user message)."""
    extract_after_idle_minutes: int = DEFAULT_EXTRACT_AFTER_IDLE_MINUTES
    """A session's new messages are extracted once it has had no message for this long."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MemoryPolicy:
        """The policy of a valid ``config`` (see :func:`policy_errors`); missing keys: defaults."""
        return cls(**{key: int(config[key]) for key in LIMITS if key in config})


def policy_errors(config: object) -> dict[str, str]:
    """What is wrong with a memory binding's ``config``: ``{key: message}``, ``{}`` if valid."""
    if not isinstance(config, dict):
        return {"config": "A JSON object."}
    errors = {}
    unknown = sorted(set(config) - set(LIMITS))
    if unknown:
        errors["config"] = f"Unknown keys {unknown}; allowed: {sorted(LIMITS)}."
    for key, (low, high) in LIMITS.items():
        value = config.get(key)
        if key in config and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            errors[key] = f"An integer from {low} to {high}."
    return errors
