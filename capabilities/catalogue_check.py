"""Check the operator catalogue's programs where they will run: in the sandbox (issue 37).

An operator who adds a stdio MCP server or a CLI command to ``deploy/catalogue.yaml`` learns
only at a tenant's first tool call that the sandbox cannot see the program: it was installed
under ``/root`` or ``/home`` (hidden), ``/tmp`` (a fresh tmpfs inside), a directory of mode 0700
(the sandbox user cannot enter it), or in a virtualenv made from a Python the sandbox cannot
see (its ``bin/python`` is a link into ``/root/.pyenv``). :func:`template_check` says so before
any tenant meets it, in two steps:

1. **Where the program is** (:func:`program_problems`): the executable resolved as the sandbox
   resolves it (an absolute path, or the sandbox's ``PATH``), links followed, must lie under
   what the sandbox shows (``/usr`` and the merged-/usr links, the profile's read-only binds),
   and every directory from ``/`` down to it must let the sandbox user through.
2. **Whether it starts** (:func:`start_once`): a stdio MCP server is started confined, as a
   run starts it, with the template's default parameters and placeholder secrets, and must
   answer ``tools/list``; a CLI program is started confined with ``--help`` and must at least
   be executed (bubblewrap reports ``execvp`` failures; the program's own exit status is not
   judged, since not every program knows ``--help``).

``manage.py catalogue_check`` runs it for every enabled template (or the slugs given).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from capabilities.catalogue import ProgramTemplate, TemplateKind, template_argv, template_profile
from capabilities.confinement import SANDBOX_PATH, SandboxProfile, confined_argv, confined_env
from capabilities.mcp.client import McpConnection
from capabilities.mcp.config import McpServerConfig
from capabilities.tools import ToolError

VISIBLE_SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
"""Host paths every sandbox shows read-only (``/usr`` and the merged-/usr links;
:mod:`capabilities.confinement`)."""

HIDDEN_PREFIXES = {
    "/tmp": "a fresh, empty tmpfs inside the sandbox",
    "/root": "hidden from the sandbox (and mode 0700)",
    "/home": "hidden from the sandbox (its /home/sandbox is a directory of its own)",
    "/run": "hidden from the sandbox",
    "/var": "not shown in the sandbox unless bound",
}
"""Places operators install programs that a confined program never sees, and why."""

PLACEHOLDER_SECRET = "catalogue-check-placeholder"
"""The value each of a template's secrets gets for the start (a real key is the tenant's)."""


@dataclass
class TemplateCheck:
    """What :func:`template_check` found for one template.

    ``ok``: the program is where the sandbox sees it and started (stdio: listed its tools).
    ``problems``: what is wrong, each a sentence that says what to do. ``detail``: what the
    start showed (``"3 tools: get_current_time, ..."``), or why it was not tried.
    """

    slug: str
    kind: str
    problems: list[str] = field(default_factory=list)
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _inside(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def resolve_program(program: str) -> str | None:
    """The host path the sandbox executes for ``program``: itself when absolute, else the first
    match on the sandbox's ``PATH`` (:data:`capabilities.confinement.SANDBOX_PATH`, all of it
    under ``/usr`` or its links). None when there is none."""
    if program.startswith("/"):
        return program if os.path.exists(program) else None
    return shutil.which(program, path=SANDBOX_PATH)


def _visible(path: str, ro_binds: tuple[str, ...]) -> bool:
    return any(_inside(path, p) for p in (*VISIBLE_SYSTEM_PREFIXES, *ro_binds))


def _traversal_problems(path: str, *, uid: int) -> list[str]:
    """Directories from ``/`` down to ``path`` that user ``uid`` (not their owner) cannot enter,
    and ``path`` itself if that user cannot read and execute it."""
    problems: list[str] = []
    parts = PurePosixPath(path).parts
    for depth in range(2, len(parts)):
        directory = str(PurePosixPath(*parts[:depth]))
        try:
            mode = os.stat(directory)
        except OSError:
            continue
        if mode.st_uid != uid and not mode.st_mode & stat.S_IXOTH:
            problems.append(f"the directory {directory} is mode {stat.S_IMODE(mode.st_mode):04o}: the sandbox user "
                            f"(uid {uid}) cannot enter it; chmod o+x {directory}, or install the program elsewhere")
    try:
        mode = os.stat(path)
    except OSError:
        return problems
    if mode.st_uid != uid and (mode.st_mode & (stat.S_IROTH | stat.S_IXOTH)) != (stat.S_IROTH | stat.S_IXOTH):
        problems.append(f"{path} is mode {stat.S_IMODE(mode.st_mode):04o}: the sandbox user cannot read and run it; "
                        f"chmod o+rx {path}")
    return problems


def program_problems(program: str, profile: SandboxProfile) -> list[str]:
    """Why the sandbox of ``profile`` could not run ``program`` (empty: nothing found wrong).

    Args:
        program: the template's rendered ``argv[0]`` (``${PYTHON}`` already substituted).
        profile: the sandbox profile the program starts in (its read-only binds and user).

    Returns:
        One sentence per problem, each saying what to change: not found, hidden (under
        :data:`HIDDEN_PREFIXES` or outside everything the sandbox shows), a link that leads out of
        what the sandbox shows (a virtualenv of a Python the sandbox cannot see), or a directory
        or file the sandbox user may not enter or read.
    """
    path = resolve_program(program)
    if path is None:
        where = "does not exist" if program.startswith("/") else f"is not on the sandbox's PATH ({SANDBOX_PATH})"
        return [f"{program} {where}: install it under /usr/local, or under a directory such as /opt/<name> "
                "named in the template's ro_binds, and give its absolute path"]
    problems: list[str] = []
    for label, candidate in (("", path), (" (where its link leads)", os.path.realpath(path))):
        if _visible(candidate, profile.ro_binds):
            continue
        hidden = next((why for prefix, why in HIDDEN_PREFIXES.items() if _inside(candidate, prefix)), None)
        reason = f"{hidden}" if hidden else "outside everything the sandbox shows (/usr and the template's ro_binds)"
        advice = ("make the virtualenv from /usr/bin/python3 (python3 -m venv), not from a Python under /root "
                  "or /home" if label else "install it under /usr/local, or under /opt/<name> and add that "
                  "directory to the template's ro_binds")
        problems.append(f"{candidate}{label} is {reason}: {advice}")
        break
    if not problems:
        uid = profile.uid if os.geteuid() == 0 else os.geteuid()  # a non-root worker's programs run as itself
        for candidate in dict.fromkeys([path, os.path.realpath(path)]):
            problems += [p for p in _traversal_problems(candidate, uid=uid) if p not in problems]
    return problems


def _default_parameters(template: ProgramTemplate) -> tuple[dict[str, str], list[str]]:
    values, missing = {}, []
    for parameter in template.tenant_parameters or []:
        default = parameter.get("default")
        if default not in (None, ""):
            values[parameter["name"]] = str(default)
        elif parameter.get("required"):
            missing.append(parameter["name"])
    return values, missing


def _start_mcp(template: ProgramTemplate, argv: list[str], profile: SandboxProfile, timeout: float) -> tuple[str, str]:
    config = McpServerConfig(alias=template.slug.replace(".", "-")[:64], transport="stdio", command=argv[0],
                             args=tuple(argv[1:]), sandbox=profile, connect_timeout_seconds=timeout,
                             list_timeout_seconds=timeout, call_timeout_seconds=max(1.0, template.timeout_seconds))

    async def probe() -> list[str]:
        async with McpConnection(config) as connection:
            return [t.name for t in await connection.list_tools()]

    try:
        names = asyncio.run(probe())
    except ToolError as exc:
        return "", f"it did not answer as an MCP server over stdio: {exc.message}"
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"{len(names)} tools: {shown}", ""


def _start_cli(argv: list[str], profile: SandboxProfile, timeout: float) -> tuple[str, str]:
    try:
        done = subprocess.run(confined_argv([argv[0], "--help"], profile), env=confined_env(profile),
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"started (still running after {timeout:g} s with --help; stopped)", ""
    stderr = done.stderr.decode("utf-8", "replace").strip()
    if "bwrap:" in stderr and ("execvp" in stderr or "Can't" in stderr):
        return "", f"the sandbox could not start it: {stderr.splitlines()[-1][:300]}"
    return f"started (exit status {done.returncode} with --help)", ""


def start_once(template: ProgramTemplate, *, timeout_seconds: float = 30.0) -> tuple[str, str]:
    """Start ``template``'s program once, confined, with its default parameters and
    :data:`PLACEHOLDER_SECRET` for each secret. Blocking; runs its own event loop (call it from
    a thread without one).

    Returns:
        ``(detail, problem)``: what it showed, and why it failed (empty when it worked).
    """
    values, missing = _default_parameters(template)
    if missing:
        return f"not started: the tenant parameters {', '.join(missing)} have no default", ""
    argv = template_argv(template, values)
    profile = template_profile(template, dict.fromkeys(template.secrets or [], PLACEHOLDER_SECRET))
    if template.kind == TemplateKind.MCP_STDIO:
        return _start_mcp(template, argv, profile, timeout_seconds)
    return _start_cli(argv, profile, timeout_seconds)


def template_check(template: ProgramTemplate, *, start: bool = True, timeout_seconds: float = 30.0) -> TemplateCheck:
    """Check one catalogue template: where its program is (:func:`program_problems`), then,
    unless that already failed or ``start`` is False, one confined start (:func:`start_once`).

    Raises nothing for a bad template: a template whose argv cannot be rendered is a problem
    of the result.
    """
    result = TemplateCheck(slug=template.slug, kind=template.kind)
    started = time.monotonic()
    values, _missing = _default_parameters(template)
    try:
        argv = template_argv(template, values)
        profile = template_profile(template, {})
    except ValueError as exc:
        result.problems.append(f"the template cannot be rendered with its defaults: {exc}")
        return result
    if not argv:
        result.problems.append("the template's argv is empty")
        return result
    result.problems += program_problems(argv[0], profile)
    if start and not result.problems:
        result.detail, problem = start_once(template, timeout_seconds=timeout_seconds)
        if problem:
            result.problems.append(problem)
    result.seconds = time.monotonic() - started
    return result
