"""Parsing SKILL.md: YAML front matter between ``---`` lines, then the Markdown instructions.

The format follows Anthropic's Agent Skills ``SKILL.md`` (https://agentskills.io/specification)::

    ---
    name: summarize-page
    description: Summarize a web page in five bullet points. Use when asked for a summary.
    allowed_tools: [web_read, "todo_*"]     # or allowed-tools: "web_read todo_*"
    model_route: cheap                       # optional: a route of the tenant, by name
    max_loop_count: 6                        # optional (default 8)
    ---
    You summarize pages. Read the page with web_read, then ...

Keys ``license``, ``metadata``, ``version`` and ``compatibility`` of that specification are
accepted and ignored; any other key is an error (a typo such as ``allowed_tool`` must not
silently give a skill no tools).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from capabilities.skills.models import SKILL_NAME_PATTERN

MAX_SKILL_BYTES = 256 * 1024
"""Largest SKILL.md accepted (256 KiB): instructions are a prompt, not a document store."""

_KNOWN_KEYS = {"name", "description", "allowed_tools", "allowed-tools", "model_route", "model-route",
               "max_loop_count", "max-loop-count"}
_IGNORED_KEYS = {"license", "metadata", "version", "compatibility"}
_FENCE = re.compile(r"^---[ \t]*$", re.MULTILINE)


class SkillParseError(ValueError):
    """A SKILL.md that cannot be used; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class ParsedSkill:
    """The fields of one SKILL.md."""

    name: str
    description: str
    instructions: str
    """The Markdown body, stripped."""
    allowed_tools: list[str]
    """Exposed tool names or fnmatch patterns; [] = no tools."""
    model_route: str | None
    """A route name of the tenant, resolved when the skill is saved."""
    max_loop_count: int | None
    source: str


def skill_parse(text: str) -> ParsedSkill:
    """Parse the text of a SKILL.md.

    Raises:
        SkillParseError: no or unterminated front matter, invalid YAML (with its line),
            front matter that is not a mapping, a missing or invalid ``name``/``description``,
            an unknown key, an ``allowed_tools`` that is not a list of names, a bad
            ``max_loop_count``, an empty body, or a file over :data:`MAX_SKILL_BYTES`.
    """
    if len(text.encode("utf-8")) > MAX_SKILL_BYTES:
        raise SkillParseError(f"SKILL.md is larger than {MAX_SKILL_BYTES // 1024} KiB.")
    text = text.lstrip("\ufeff")
    if not text.startswith("---"):
        raise SkillParseError("SKILL.md must start with YAML front matter between '---' lines.")
    first = _FENCE.match(text)
    if first is None:
        raise SkillParseError("The first line of SKILL.md must be exactly '---'.")
    closing = _FENCE.search(text, first.end())
    if closing is None:
        raise SkillParseError("The YAML front matter is not closed by a '---' line.")
    header, body = text[first.end():closing.start()], text[closing.end():]
    try:
        meta = yaml.safe_load(header)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SkillParseError(f"The front matter is not valid YAML{where}: {problem}.") from exc
    if not isinstance(meta, dict):
        raise SkillParseError("The front matter must be a YAML mapping (key: value lines).")
    unknown = sorted(str(k) for k in meta if k not in _KNOWN_KEYS | _IGNORED_KEYS)
    if unknown:
        raise SkillParseError(
            f"Unknown front matter key(s): {', '.join(unknown)}. Known: name, description, allowed_tools, "
            "model_route, max_loop_count."
        )

    def get(key: str) -> object:
        return meta.get(key, meta.get(key.replace("_", "-")))

    name = get("name")
    if not isinstance(name, str) or not re.fullmatch(SKILL_NAME_PATTERN, name):
        raise SkillParseError(
            f"'name' must be 1-64 letters, digits, '_' or '-' (it becomes the tool name); got {name!r}."
        )
    description = get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillParseError("'description' is required: say what the skill does and when to use it.")
    allowed = get("allowed_tools")
    if allowed is None:
        allowed_tools: list[str] = []
    elif isinstance(allowed, str):
        allowed_tools = [t for t in re.split(r"[\s,]+", allowed) if t]
    elif isinstance(allowed, list) and all(isinstance(t, str) and t.strip() for t in allowed):
        allowed_tools = [t.strip() for t in allowed]
    else:
        raise SkillParseError("'allowed_tools' must be a list of tool names or patterns (or one string of them).")
    route = get("model_route")
    if route is not None and (not isinstance(route, str) or not route.strip()):
        raise SkillParseError("'model_route' must be the name of one of the tenant's model routes.")
    loops = get("max_loop_count")
    if loops is not None and (isinstance(loops, bool) or not isinstance(loops, int) or not 1 <= loops <= 200):
        raise SkillParseError(f"'max_loop_count' must be a whole number from 1 to 200; got {loops!r}.")
    instructions = body.strip()
    if not instructions:
        raise SkillParseError("The instructions (the Markdown after the front matter) are empty.")
    return ParsedSkill(
        name=name, description=description.strip(), instructions=instructions, allowed_tools=allowed_tools,
        model_route=route.strip() if isinstance(route, str) else None, max_loop_count=loops, source=text,
    )
