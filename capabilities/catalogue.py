"""The operator catalogue: the programs a tenant may have the platform start.

A tenant admin never writes a command line. A platform operator (a superuser, or
``manage.py catalogue_import catalogue.yaml``) publishes :class:`ProgramTemplate` rows: a stdio
MCP server or a CLI command with a fixed program and argv, the parameters and secrets a
tenant may fill in, and a sandbox profile (network ``none`` or ``egress``, extra read-only
binds). A tenant admin enables a template for the tenant by creating an MCP server or CLI
command from it (choosing it, filling its parameters and secrets) and binds that to agents.

Argv rules (checked by :meth:`ProgramTemplate.clean`):

- ``${NAME}`` is a tenant parameter (declared in ``tenant_parameters``); its value must match
  the declaration's ``pattern`` (default :data:`DEFAULT_PARAMETER_PATTERN`, no braces, no
  spaces), and it is substituted inside its element (which stays one argv element). Whatever
  the pattern allows, a tenant's value is refused (:func:`parameters_errors`) when it would
  start an element with ``-`` (option injection; the model's rule of
  :mod:`capabilities.cli.template`: not inside an element, nor after a literal ``--``), and
  when it is, or holds after ``=``, ``,``, ``:`` or ``;``, a path into :data:`FORBIDDEN_PATH_PREFIXES`
  or the platform's own tree, or a path that climbs with ``..``.
- ``${PYTHON}`` is the sandbox's Python (``settings.SANDBOX_PYTHON``), for programs that are
  Python modules (``["${PYTHON}", "-m", "mcp_server_time"]``).
- For CLI templates, ``{name}`` placeholders are the model's arguments, with the rules of
  :mod:`capabilities.cli.template` (program fixed, one element per value, no option
  injection); ``parameters_schema`` describes them.
- Element 0, the program, holds no placeholder at all except ``${PYTHON}``.

Every program started from a template runs confined (:mod:`capabilities.confinement`).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from capabilities.confinement import LIMIT_FIELDS, SandboxLimits, SandboxProfile, bind_path_check
from capabilities.data_dirs import data_dir_errors, on_tenant_deleted

TENANT_PARAMETER_RE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")
"""``${NAME}`` in an argv element: a tenant parameter, or ``${PYTHON}``."""

DEFAULT_PARAMETER_PATTERN = r"[A-Za-z0-9_.,:/@+=-]{0,200}"
"""What a tenant parameter's value may be unless its declaration says otherwise."""

PLATFORM_VARIABLES = frozenset({"PYTHON"})

FORBIDDEN_PATH_PREFIXES = ("/proc", "/sys", "/dev", "/run", "/var/run")
"""Where no tenant parameter may point a program: kernel interfaces (``/proc/self/environ`` is
the program's own environment: the template's variables and the secrets), device nodes and
sockets (the egress proxy's is ``/run/egress.sock``). The platform's tree (``BASE_DIR``) too."""
_PATH_SEPARATORS_RE = re.compile(r"[=,:;]")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_ARGV = 256


class TemplateKind(models.TextChoices):
    MCP_STDIO = "mcp_stdio", "MCP server (stdio)"
    CLI = "cli", "CLI command"


class NetworkProfile(models.TextChoices):
    NONE = "none", "No network"
    EGRESS = "egress", "Public internet through the egress proxy"


def _default_schema() -> dict:
    return {"type": "object", "properties": {}, "required": []}


class ProgramTemplate(models.Model):
    """A program an operator allows tenants to run, and how it is confined.

    Not tenant-owned: the catalogue is the platform's. ``tenants`` empty means every tenant
    may use it; otherwise only those listed.
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True, help_text="What tenant admins read when they pick it.")
    kind = models.CharField(max_length=16, choices=TemplateKind.choices)
    argv = models.JSONField(
        default=list,
        help_text='JSON list of strings: the program and its arguments, e.g. ["${PYTHON}", "-m", "mcp_server_time"]. '
                  "${NAME}: a tenant parameter; {name}: a model argument (CLI only).",
    )
    tenant_parameters = models.JSONField(
        default=list, blank=True,
        help_text='Parameters a tenant fills in: [{"name": "TIMEZONE", "description": "...", "default": "UTC", '
                  '"pattern": "[A-Za-z_/+-]{1,64}", "required": false}].',
    )
    secrets = models.JSONField(
        default=list, blank=True,
        help_text='Environment variables a tenant fills in as secrets (stored encrypted), e.g. ["API_TOKEN"].',
    )
    env = models.JSONField(default=dict, blank=True, help_text="Fixed environment variables (not secret).")
    network = models.CharField(max_length=8, choices=NetworkProfile.choices, default=NetworkProfile.NONE)
    ro_binds = models.JSONField(
        default=list, blank=True,
        help_text="Extra host paths visible read-only in the sandbox (besides /usr and SANDBOX_RO_BINDS).",
    )
    parameters_schema = models.JSONField(
        default=_default_schema, blank=True, help_text="CLI only: JSON Schema of the model's arguments.",
    )
    timeout_seconds = models.FloatField(
        default=30.0, help_text="CLI: the longest a call may run; MCP: the longest a tool call may take.",
    )
    max_output_bytes = models.PositiveIntegerField(default=64 * 1024, help_text="CLI: kept of stdout and of stderr.")
    limits = models.JSONField(
        default=dict, blank=True,
        help_text='Resource limits of each process of the program, lowered from the operator maximum '
                  '(SANDBOX_LIMITS; a higher value is lowered to it), e.g. {"cpu_seconds": 10, "memory_mb": 256, '
                  '"processes": 64, "file_size_mb": 16, "open_files": 256}. Empty: the maximum.',
    )
    tenants = models.ManyToManyField(
        "tenants.Tenant", blank=True, related_name="+",
        help_text="Tenants that may use it; none selected: every tenant.",
    )
    data_dir = models.JSONField(
        default=dict, blank=True,
        help_text='A persistent data directory, kept across restarts: {"mount": "/data", "per": "tenant" | "server", '
                  '"quota_mb": 256} (capabilities/data_dirs.py). Empty: none (the program\'s files go with its process).',
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "program template"

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def clean(self) -> None:
        """Raises ValidationError (by field) for a template that breaks the catalogue's rules."""
        errors: dict[str, list[str]] = {}
        declared = self._declared(errors)
        argv = self.argv
        if not isinstance(argv, list) or not 1 <= len(argv) <= _MAX_ARGV or not all(isinstance(a, str) for a in argv):
            errors.setdefault("argv", []).append(f"A JSON list of 1 to {_MAX_ARGV} strings.")
        else:
            program = argv[0]
            if not program or (program != "${PYTHON}" and ("${" in program or "{" in program)):
                errors.setdefault("argv", []).append("Element 0 is the program: fixed text, or ${PYTHON}.")
            for element in argv:
                for name in TENANT_PARAMETER_RE.findall(element):
                    if name not in declared and name not in PLATFORM_VARIABLES:
                        errors.setdefault("argv", []).append(f"${{{name}}} is not a declared tenant parameter.")
            if self.kind == TemplateKind.CLI and "argv" not in errors:
                from capabilities.cli.template import template_errors

                rendered = [TENANT_PARAMETER_RE.sub("x", a) for a in argv]
                for field, messages in template_errors(rendered, self.parameters_schema).items():
                    errors.setdefault("argv" if field == "argv_template" else field, []).extend(messages)
        secrets = self.secrets
        if not isinstance(secrets, list) or not all(isinstance(s, str) and _ENV_NAME_RE.fullmatch(s) for s in secrets):
            errors.setdefault("secrets", []).append("A JSON list of environment variable names.")
        env = self.env
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and _ENV_NAME_RE.fullmatch(k) and isinstance(v, str) and "\0" not in v
            for k, v in env.items()
        ):
            errors.setdefault("env", []).append("A JSON object of variable names to strings.")
        elif isinstance(secrets, list) and set(secrets) & set(env):
            errors.setdefault("secrets", []).append("A name may not be both a secret and a fixed variable.")
        if not isinstance(self.ro_binds, list):
            errors.setdefault("ro_binds", []).append("A JSON list of absolute paths.")
        else:
            for path in self.ro_binds:
                try:
                    bind_path_check(path)
                except ValueError as exc:
                    errors.setdefault("ro_binds", []).append(str(exc))
        limits = self.limits
        if not isinstance(limits, dict):
            errors.setdefault("limits", []).append(f"A JSON object with some of: {', '.join(LIMIT_FIELDS)}.")
        else:
            for name, value in limits.items():
                if name not in LIMIT_FIELDS:
                    errors.setdefault("limits", []).append(f"{name!r} is not a limit ({', '.join(LIMIT_FIELDS)}).")
                elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    errors.setdefault("limits", []).append(f"{name}: a positive integer.")
        errors.update(self._data_dir_problems())
        if not (0 < float(self.timeout_seconds or 0) <= 3600):
            errors.setdefault("timeout_seconds", []).append("Between 0 and 3600 seconds.")
        if errors:
            raise ValidationError(errors)

    def _data_dir_problems(self) -> dict[str, list[str]]:
        problems = data_dir_errors(self.data_dir)
        if not problems and self.data_dir and self.kind != TemplateKind.MCP_STDIO:
            problems = ["Only a stdio MCP server keeps data (a CLI command's files go with each call)."]
        return {"data_dir": problems} if problems else {}

    def _declared(self, errors: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
        declared: dict[str, dict[str, Any]] = {}
        params = self.tenant_parameters
        if not isinstance(params, list):
            errors.setdefault("tenant_parameters", []).append("A JSON list of parameter declarations.")
            return declared
        for item in params:
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or name in PLATFORM_VARIABLES:
                errors.setdefault("tenant_parameters", []).append(
                    f"Each parameter needs a name of capitals, digits and '_' (not PYTHON): {item!r}.")
                continue
            pattern = item.get("pattern", DEFAULT_PARAMETER_PATTERN)
            try:
                re.compile(pattern)
            except (re.error, TypeError):
                errors.setdefault("tenant_parameters", []).append(f"{name}: the pattern is not a regular expression.")
                continue
            default = item.get("default")
            if default is not None and (not isinstance(default, str) or not re.fullmatch(pattern, default)):
                errors.setdefault("tenant_parameters", []).append(f"{name}: the default does not match the pattern.")
            declared[name] = item
        return declared

    def available_to(self, tenant_id: int) -> bool:
        """Whether the tenant ``tenant_id`` may use this template (enabled, and listed or open to all)."""
        if not self.enabled:
            return False
        allowed = list(self.tenants.values_list("pk", flat=True))
        return not allowed or tenant_id in allowed


def parameters_errors(template: ProgramTemplate, values: Any) -> list[str]:
    """What is wrong with a tenant's ``values`` for ``template``'s parameters ([] when fine)."""
    if not isinstance(values, dict):
        return ["A JSON object of parameter values."]
    declared = {p["name"]: p for p in template.tenant_parameters if isinstance(p, dict) and "name" in p}
    problems = [f"{name!r} is not a parameter of {template.slug!r}." for name in values if name not in declared]
    for name, item in declared.items():
        value = values.get(name, item.get("default"))
        if value is None:
            if item.get("required"):
                problems.append(f"{name} is required.")
            continue
        pattern = item.get("pattern", DEFAULT_PARAMETER_PATTERN)
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            problems.append(f"{name}: {str(value)[:100]!r} does not match {pattern}.")
        elif name in values:  # the operator's own defaults are trusted
            problem = _path_problem(name, value) or _option_problem(template, name, values)
            if problem:
                problems.append(problem)
    return problems


def _option_problem(template: ProgramTemplate, name: str, values: dict[str, Any]) -> str | None:
    """The option-injection message when the tenant's value of ``name`` starts with ``-`` and
    would start an argv element: the placeholder opens the element (or only empty values come
    before it), and no literal ``--`` element came earlier. The rule of a model's argument
    (:func:`capabilities.cli.template.render_argv`)."""
    from capabilities.cli.template import leading_dash_error

    if not str(values[name]).startswith("-") or not isinstance(template.argv, list):
        return None
    declared = {p["name"]: p for p in template.tenant_parameters if isinstance(p, dict) and "name" in p}
    for element in template.argv:
        if element == "--":
            return None
        position = 0
        for match in TENANT_PARAMETER_RE.finditer(str(element)):
            if match.start() != position:
                break  # literal text opens the element
            current = match.group(1)
            if current == name:
                return leading_dash_error(name)
            rendered = "x" if current in PLATFORM_VARIABLES else values.get(current, declared.get(current, {}).get("default"))
            if rendered:
                break
            position = match.end()
    return None


def _path_problem(name: str, value: str) -> str | None:
    """The message when ``value`` (or a part of it after ``=``, ``,``, ``:`` or ``;``, e.g. a
    ``file:`` URL or ``key=/path``) is a path into :data:`FORBIDDEN_PATH_PREFIXES` or the
    platform's tree, or climbs with ``..`` (the sandbox's cwd is ``/home/sandbox``: ``../../proc``
    is ``/proc``)."""
    from django.conf import settings

    platform = str(settings.BASE_DIR)
    for part in _PATH_SEPARATORS_RE.split(value):
        if ".." in part.split("/"):
            return f"{name}: {value!r} climbs out of its directory with '..'; give the path without it."
        if not part.startswith("/"):
            continue
        path = posixpath.normpath("/" + part.lstrip("/"))
        for prefix in (*FORBIDDEN_PATH_PREFIXES, platform):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                where = "the platform's own files" if prefix == platform else prefix
                return f"{name}: {value!r} points into {where}, which no program of the catalogue may be given."
    return None


def secrets_errors(template: ProgramTemplate, secrets: Any) -> list[str]:
    """What is wrong with a tenant's secrets (names must be the template's) ([] when fine)."""
    if secrets is None:
        return []
    if not isinstance(secrets, dict):
        return ["A JSON object of secret values."]
    problems = [f"{name!r} is not a secret of {template.slug!r} (it has: {', '.join(template.secrets) or 'none'})."
                for name in secrets if name not in template.secrets]
    problems += [f"{name}: NUL characters are not allowed." for name, v in secrets.items()
                 if not isinstance(v, str) or "\0" in v]
    return problems


def template_argv(template: ProgramTemplate, values: dict[str, str]) -> list[str]:
    """The template's argv with ``${PYTHON}`` and the tenant's parameters substituted.

    Raises:
        ValueError: a value is missing or does not match its pattern (see :func:`parameters_errors`).
    """
    from django.conf import settings

    problems = parameters_errors(template, values)
    if problems:
        raise ValueError("; ".join(problems))
    declared = {p["name"]: p for p in template.tenant_parameters}

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "PYTHON":
            return settings.SANDBOX_PYTHON
        return str(values.get(name, declared[name].get("default") or ""))

    return [TENANT_PARAMETER_RE.sub(substitute, element) for element in template.argv]


def template_profile(template: ProgramTemplate, secrets: dict[str, str], *,
                     data_bind: tuple[str, str] | None = None) -> SandboxProfile:
    """The sandbox profile of a program started from ``template`` with the tenant's ``secrets``.

    The deployment's settings add what is the operator's across templates: the sandbox's user,
    bubblewrap, the read-only binds every program gets (``SANDBOX_RO_BINDS``, e.g. the sandbox's
    Python environment), the Python of the egress bridge and the maximum resource limits
    (``SANDBOX_LIMITS``), which the template's ``limits`` may lower (:func:`template_limits`).
    ``data_bind``: the program's persistent data directory, prepared
    (:func:`capabilities.data_dirs.template_data_bind`), bound writable.
    """
    from django.conf import settings

    allowed = {k: v for k, v in (secrets or {}).items() if k in template.secrets}
    return SandboxProfile(
        network=template.network,
        ro_binds=tuple(dict.fromkeys([*settings.SANDBOX_RO_BINDS, *template.ro_binds])),
        env={**template.env, **allowed},
        uid=settings.SANDBOX_UID,
        gid=settings.SANDBOX_GID,
        bwrap_path=settings.CLI_BWRAP_PATH,
        bridge_python=settings.SANDBOX_BRIDGE_PYTHON,
        limits=template_limits(template),
        data_binds=(data_bind,) if data_bind else (),
    )


def operator_limits() -> SandboxLimits:
    """The operator's maximum limits (``settings.SANDBOX_LIMITS``; a name it omits: the built-in default).

    Raises:
        ValueError: the setting names an unknown limit or a value that is not a positive integer.
    """
    from django.conf import settings

    configured = dict(getattr(settings, "SANDBOX_LIMITS", {}) or {})
    unknown = set(configured) - set(LIMIT_FIELDS)
    if unknown:
        raise ValueError(f"SANDBOX_LIMITS: unknown limits {sorted(unknown)}; known: {', '.join(LIMIT_FIELDS)}")
    return SandboxLimits(**configured)


def template_limits(template: ProgramTemplate) -> SandboxLimits:
    """The limits of a program started from ``template``: its ``limits``, each no higher than the
    operator's maximum (:func:`operator_limits`); a limit it does not name is the maximum. A
    malformed ``limits`` (not a JSON object; :meth:`ProgramTemplate.clean` refuses it) counts as empty."""
    maximum = operator_limits()
    values = template.limits if isinstance(template.limits, dict) else {}
    usable = {k: v for k, v in values.items()
              if k in LIMIT_FIELDS and isinstance(v, int) and not isinstance(v, bool) and v >= 1}
    return SandboxLimits.from_mapping(usable, maximum=maximum)


# A tenant's programs' data directories go with the tenant (capabilities/data_dirs.py).
models.signals.post_delete.connect(on_tenant_deleted, sender="tenants.Tenant", dispatch_uid="capabilities.data_dirs")
