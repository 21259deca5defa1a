"""The registry of built-in tools.

A built-in tool is a :class:`capabilities.tools.Tool` subclass registered by name with
:func:`register_builtin`. Bindings of kind ``builtin`` name one; the runner instantiates it
per run with :func:`builtin_create`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from capabilities.tools import Tool

T = TypeVar("T", bound=type[Tool])

_REGISTRY: dict[str, type[Tool]] = {}


def register_builtin(name: str) -> Callable[[T], T]:
    """Class decorator: register a Tool subclass as the built-in tool ``name``."""

    def decorator(cls: T) -> T:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"built-in tool {name!r} registered twice")
        _REGISTRY[name] = cls
        return cls

    return decorator


def _load() -> None:
    # Importing the modules registers their tools.
    from capabilities.builtin import artifacts, ask_user, documents, todo, web  # noqa: F401


def builtin_names() -> frozenset[str]:
    """Names of all registered built-in tools."""
    _load()
    return frozenset(_REGISTRY)


def builtin_create(name: str) -> Tool:
    """A fresh instance of the built-in tool ``name``. Raises KeyError if unknown."""
    _load()
    return _REGISTRY[name]()
