"""The registry of built-in tools.

A built-in tool is a :class:`capabilities.tools.Tool` subclass registered by name with
:func:`register_builtin` (:mod:`capabilities.builtin.registration`, re-exported here). Bindings
of kind ``builtin`` name one; the runner instantiates it per run with :func:`builtin_create`.
"""

from __future__ import annotations

from capabilities.builtin.registration import REGISTERED, register_builtin
from capabilities.tools import Tool

__all__ = ["builtin_create", "builtin_names", "register_builtin"]


def _load() -> None:
    # Importing the modules registers their tools.
    from capabilities.builtin import artifacts, ask_user, documents, todo, web  # noqa: F401


def builtin_names() -> frozenset[str]:
    """Names of all registered built-in tools."""
    _load()
    return frozenset(REGISTERED)


def builtin_create(name: str) -> Tool:
    """A fresh instance of the built-in tool ``name``. Raises KeyError if unknown."""
    _load()
    return REGISTERED[name]()
