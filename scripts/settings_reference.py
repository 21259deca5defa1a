#!/usr/bin/env python3
"""Write docs/settings.md, the settings reference, from agent_platform/settings.py.

Usage: ``python scripts/settings_reference.py`` (writes the file), ``--check`` (exit status 1,
writing nothing, when docs/settings.md differs from what settings.py gives).

The source is read, never imported (importing it needs keys and a database): its syntax tree
gives every environment variable it reads, with

- the name: the first argument of ``os.environ.get(...)``, ``os.getenv(...)``,
  ``os.environ[...]``, or of a helper function of settings.py that reads the environment with
  its argument (``_env_bool("DEBUG", False)``, ``_secret("SECRET_KEY")``,
  ``_gc_thresholds("WEB_GC_THRESHOLDS", ...)``);
- the default: the call's second argument, or the helper's own default, as written (an
  arithmetic expression of constants such as ``str(7 * 24 * 3600)`` is worked out; anything
  else is shown as code, marked "computed");
- the Django setting it feeds: the name assigned by the top-level statement holding the call;
- the description: the comment block above that statement (or above the group of statements
  it belongs to, see :func:`_group_comment`), the comment lines right above the call and at
  the end of its line, a docstring right after the statement, and the variable's entry in the
  module docstring's "Environment variables" list; with none of these, a comment elsewhere in
  settings.py that names the variable.

Names the module docstring lists that the code reads through another module (``DATABASE_URL``,
read by agent_platform/local_secrets.py) are listed from the docstring alone.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "agent_platform" / "settings.py"
OUTPUT = ROOT / "docs" / "settings.md"
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass
class Variable:
    """One environment variable read by settings.py."""

    name: str
    default: str  # Markdown: `value`, "empty", "none", or "computed: `expr`"
    setting: str  # the Django setting it feeds ("" when none is assigned)
    group: str  # the comment block above its statement (shared by a group of statements)
    notes: list[str] = field(default_factory=list)  # comments and docstrings of its own
    line: int = 0


def _render_default(node: ast.expr | None, source: str) -> str:
    """``node`` (a default value in settings.py) as Markdown."""
    if node is None:
        return "none"
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            return "`1`" if value else "`0`"
        if value is None:
            return "none"
        return f"`{value}`" if str(value) != "" else "empty"
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Mult, ast.FloorDiv, ast.Add, ast.Sub,
               ast.Call, ast.Name, ast.Load)
    expression = ast.Expression(node)
    if all(isinstance(n, allowed) for n in ast.walk(expression)) and all(
            n.id == "str" for n in ast.walk(expression) if isinstance(n, ast.Name)):
        value = eval(compile(expression, "<default>", "eval"), {"__builtins__": {}, "str": str})  # noqa: S307
        return f"`{value}`"
    return f"computed: `{ast.get_source_segment(source, node)}`"


def _is_os_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os")


def _env_read(call: ast.Call) -> tuple[ast.expr, ast.expr | None] | None:
    """``(name node, default node)`` when ``call`` is ``os.environ.get`` or ``os.getenv``."""
    func = call.func
    if isinstance(func, ast.Attribute) and call.args and (
            (func.attr == "get" and _is_os_environ(func.value))
            or (func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os")):
        return call.args[0], (call.args[1] if len(call.args) > 1 else None)
    return None


@dataclass
class _Helper:
    params: list[str]
    name_param: str
    default: ast.expr | None  # a constant default read inside the helper
    default_param: str | None  # or the parameter that holds it


def _helpers(tree: ast.Module) -> dict[str, _Helper]:
    """Module-level functions of settings.py that read the environment variable named by a
    parameter: ``{function name: how}``."""
    found = {}
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        params = [a.arg for a in fn.args.args]
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            read = _env_read(node)
            if read is None and isinstance(node.func, ast.Attribute) and node.func.attr == "lookup" and node.args:
                read = (node.args[0], None)  # local_secrets.lookup(name, ...): environment, then secrets file
            if read and isinstance(read[0], ast.Name) and read[0].id in params:
                default, default_param = read[1], None
                if isinstance(default, ast.Name) and default.id in params:
                    default, default_param = None, default.id
                elif default is None and "default" in params:
                    default_param = "default"
                found[fn.name] = _Helper(params, read[0].id, default, default_param)
                break
    return found


def _assigned(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[str]:
    """The public names the innermost assignment holding ``node`` assigns (a private helper
    variable such as ``_proxy_ssl_header`` names no setting)."""
    while node in parents:
        node = parents[node]
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else None)
        if targets is not None:
            return [t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
    return []


def _comment_block_above(lines: list[str], index: int) -> list[str]:
    """The contiguous ``#`` comment lines right above line ``index`` (0-based), without the ``#``."""
    block = []
    i = index - 1
    while i >= 0 and lines[i].lstrip().startswith("#"):
        block.append(lines[i].strip().lstrip("#").strip())
        i -= 1
    return list(reversed(block))


def _group_comment(lines: list[str], index: int, grouped: set[int], name: str) -> list[str]:
    """The comment that describes the statement at line ``index`` (0-based), which reads ``name``.

    The comment block right above the group of statements holding it, a group being
    statements with no blank line between that read the environment, check a value
    (``if …: raise``) or set a private helper (``grouped``: their 0-based lines). Failing
    that, the block above the nearest run of code lines, if it names ``name``: a comment
    above unrelated constants is not borrowed."""
    for strict in (True, False):
        i = index
        while i > 0 and lines[i - 1].strip() and not lines[i - 1].lstrip().startswith("#"):
            if strict and i - 1 not in grouped:
                break
            i -= 1
        else:
            # a "# --- Section (…) ---" rule names the section, it does not describe the variable
            block = [line for line in _comment_block_above(lines, i) if not line.startswith("---")]
            if block and (strict or re.search(rf"\b{name}\b", " ".join(block))):
                return block
    return []


def _all_comment_blocks(lines: list[str]) -> list[str]:
    """Every block of whole-line comments in ``lines``, each joined into one line."""
    blocks, current = [], []
    for line in [*lines, ""]:
        if line.lstrip().startswith("#"):
            current.append(line.strip().lstrip("#").strip())
        elif current:
            blocks.append(" ".join(c for c in current if not c.startswith("---")))
            current = []
    return [b for b in blocks if b]


def _trailing_comment(line: str) -> str:
    """The ``# …`` comment at the end of a code line (outside string literals), or ""."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[i + 1:].strip()
    return ""


def _docstring_entries(tree: ast.Module) -> dict[str, str]:
    """The module docstring's list ``    NAME   description`` (continued on deeper-indented lines)."""
    entries: dict[str, str] = {}
    current = None
    for raw in (ast.get_docstring(tree, clean=False) or "").splitlines():
        match = re.match(r"^ {4}([A-Z][A-Z0-9_]*)(\s+)(\S.*)$", raw)
        if match and ("_" in match.group(1) or len(match.group(2)) > 1):  # not "TLS deployment: …"
            current = match.group(1)
            entries[current] = match.group(3).strip()
        elif current and raw.startswith(" " * 5) and raw.strip():
            entries[current] += " " + raw.strip()
        else:
            current = None
    return entries


def _reads_environment(statement: ast.stmt, helpers: dict[str, _Helper]) -> bool:
    """Whether ``statement`` reads an environment variable (directly or through a helper)."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Call) and (_env_read(node) or (isinstance(node.func, ast.Name)
                                                               and node.func.id in helpers)):
            return True
        if isinstance(node, ast.Subscript) and _is_os_environ(node.value):
            return True
    return False


def _sets_private(statement: ast.stmt) -> bool:
    """``_x = …``: a helper value of settings.py (no setting of its own)."""
    return isinstance(statement, ast.Assign) and all(
        isinstance(t, ast.Name) and t.id.startswith("_") for t in statement.targets)


def _is_check(statement: ast.stmt) -> bool:
    """``if <condition>: raise …``: a check of a value read just before."""
    return isinstance(statement, ast.If) and all(isinstance(s, ast.Raise) for s in statement.body) and not statement.orelse


def collect(source: str) -> list[Variable]:
    """Every environment variable ``source`` (settings.py's text) reads, in source order."""
    tree = ast.parse(source)
    lines = source.splitlines()
    helpers = _helpers(tree)
    helper_lines = {n for fn in tree.body if isinstance(fn, ast.FunctionDef) and fn.name in helpers
                    for n in range(fn.lineno, (fn.end_lineno or fn.lineno) + 1)}
    documented = _docstring_entries(tree)
    grouped = {n - 1 for statement in tree.body
               if _reads_environment(statement, helpers) or _is_check(statement) or _sets_private(statement)
               for n in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)}
    found: dict[str, Variable] = {}
    for index, statement in enumerate(tree.body):
        if isinstance(statement, ast.FunctionDef) and statement.name in helpers:
            continue
        parents = {child: parent for parent in ast.walk(statement) for child in ast.iter_child_nodes(parent)}
        following = tree.body[index + 1] if index + 1 < len(tree.body) else None
        docstring = (following.value.value.strip() if isinstance(following, ast.Expr)
                     and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str)
                     else "")
        for node in ast.walk(statement):
            name_node, default_node = None, None
            if isinstance(node, ast.Call):
                read = _env_read(node)
                if read:
                    name_node, default_node = read
                    parent = parents.get(node)
                    if (default_node is None and isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.Or)
                            and parent.values[0] is node):  # os.environ.get("X") or <default>
                        default_node = parent.values[1]
                elif isinstance(node.func, ast.Name) and node.func.id in helpers:
                    helper = helpers[node.func.id]
                    bound = dict(zip(helper.params, node.args, strict=False))
                    bound.update({k.arg: k.value for k in node.keywords if k.arg})
                    name_node = bound.get(helper.name_param)
                    default_node = bound.get(helper.default_param) if helper.default_param else helper.default
            elif isinstance(node, ast.Subscript) and _is_os_environ(node.value):
                name_node = node.slice
            if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)
                    and ENV_NAME.match(name_node.value)) or node.lineno in helper_lines:
                continue
            name = name_node.value
            call_index = node.lineno - 1
            notes = []
            if call_index != statement.lineno - 1:  # inside a multi-line statement: the nearest comment
                above = call_index  # lines above the call, within the statement
                while above > statement.lineno and lines[above - 1].strip() and not lines[above - 1].lstrip().startswith("#"):
                    above -= 1
                if above > statement.lineno:
                    notes += _comment_block_above(lines, above)
            if _trailing_comment(lines[call_index]):
                notes.append(_trailing_comment(lines[call_index]))
            if docstring:
                notes.append(docstring)
            if name in documented:
                notes.insert(0, documented[name])
            if name not in found:
                found[name] = Variable(
                    name=name, default=_render_default(default_node, source),
                    setting=", ".join(_assigned(node, parents)), group=" ".join(_group_comment(lines, statement.lineno - 1, grouped, name)),
                    notes=notes, line=node.lineno)
    blocks = _all_comment_blocks(lines)
    for variable in found.values():  # nothing above it: a comment elsewhere that names it
        if not variable.group and not variable.notes:
            variable.group = next((b for b in blocks if re.search(rf"\b{variable.name}\b", b)), "")
    for name, text in documented.items():  # read through another module (local_secrets)
        if name not in found:
            found[name] = Variable(name=name, default="see the description", setting="", group="",
                                   notes=[text], line=0)
    return sorted(found.values(), key=lambda v: (v.line, v.name))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(variables: list[Variable]) -> str:
    """docs/settings.md's text for ``variables``."""
    out = [
        "# Settings reference",
        "",
        "<!-- Generated by scripts/settings_reference.py from agent_platform/settings.py: do not edit;",
        "     run `python scripts/settings_reference.py` after changing the settings. -->",
        "",
        "Every environment variable `agent_platform/settings.py` reads, with its default and what it",
        "does (from the comments in settings.py). Nothing needs setting on a developer machine: `make",
        "run` works with the defaults, and the keys come from the secrets file that",
        "`scripts/bootstrap.sh` writes (`SECRET_KEY`, `ENCRYPTION_KEY` and `DATABASE_APP_PASSWORD`",
        "may be given in the environment instead; the environment wins). How the settings fit",
        "together, and what to set for a deployment: the",
        "[operations and security manual](operations-security.md).",
        "",
        "**Contents**",
        "",
        "- [All variables](#all-variables)",
        "- [What each does](#what-each-does)",
        "",
        "## All variables",
        "",
        f"{len(variables)} variables, alphabetically.",
        "",
        "| variable | default | Django setting |",
        "|---|---|---|",
    ]
    for v in sorted(variables, key=lambda v: v.name):
        out.append(f"| `{v.name}` | {_cell(v.default)} | {f'`{v.setting}`' if v.setting else ''} |")
    out += ["", "## What each does", "", "In the order of settings.py; variables described together share a block.", ""]
    groups: list[tuple[str, list[Variable]]] = []
    for v in variables:
        if groups and v.group and groups[-1][0] == v.group:
            groups[-1][1].append(v)
        else:
            groups.append((v.group, [v]))
    for group, members in groups:
        out.append("### " + ", ".join(f"`{m.name}`" for m in members))
        out.append("")
        if group:
            out += [group, ""]
        for m in members:
            line = f"- `{m.name}` (default {m.default}{f'; sets `{m.setting}`' if m.setting else ''})"
            if m.notes:
                line += ": " + " ".join(m.notes)
            out.append(line)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def generate(settings_source: str | None = None) -> str:
    """The settings reference for ``settings_source`` (default: agent_platform/settings.py)."""
    return render(collect(settings_source if settings_source is not None else SETTINGS.read_text(encoding="utf-8")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/settings.md is out of date")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run scripts/settings_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
