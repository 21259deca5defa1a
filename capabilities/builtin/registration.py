"""Where built-in tools register: :func:`register_builtin`, the class decorator each tool module
of :mod:`capabilities.builtin` applies, and the table it fills.

The lookups (:func:`capabilities.builtin.registry.builtin_names`, ``builtin_create``) live in
:mod:`capabilities.builtin.registry`, which imports the tool modules so that their tools are
registered; the tool modules import only this module, so neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from capabilities.tools import Tool

T = TypeVar("T", bound=type[Tool])

REGISTERED: dict[str, type[Tool]] = {}
"""Built-in tool name → its Tool subclass (read it through :mod:`capabilities.builtin.registry`,
which loads the platform's own tools first)."""


def register_builtin(name: str) -> Callable[[T], T]:
    """Class decorator: register a Tool subclass as the built-in tool ``name``.

    Raises:
        ValueError: another class is registered under ``name`` already.
    """

    def decorator(cls: T) -> T:
        if name in REGISTERED and REGISTERED[name] is not cls:
            raise ValueError(f"built-in tool {name!r} registered twice")
        REGISTERED[name] = cls
        return cls

    return decorator
