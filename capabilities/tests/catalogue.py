"""Program templates for tests: what an operator would publish (``deploy/catalogue.yaml``)."""

from __future__ import annotations

from typing import Any

from capabilities.catalogue import ProgramTemplate


def template(slug: str, *, kind: str, argv: list[str], **fields: Any) -> ProgramTemplate:
    """Create (or update) the template ``slug``, checked like an operator's."""
    row = ProgramTemplate.objects.filter(slug=slug).first() or ProgramTemplate(slug=slug)
    row.name, row.kind, row.argv = fields.pop("name", slug), kind, argv
    for name, value in fields.items():
        setattr(row, name, value)
    row.full_clean()
    row.save()
    return row


def time_template() -> ProgramTemplate:
    """mcp-server-time, confined, no network, with the TIMEZONE tenant parameter."""
    return template(
        "mcp-server-time", kind="mcp_stdio",
        argv=["${PYTHON}", "-m", "mcp_server_time", "--local-timezone", "${TIMEZONE}"],
        tenant_parameters=[{"name": "TIMEZONE", "default": "UTC", "pattern": "[A-Za-z0-9_/+-]{1,64}"}],
        timeout_seconds=60,
    )


def cli_template(slug: str, argv: list[str], schema: dict[str, Any] | None = None, **fields: Any) -> ProgramTemplate:
    """A CLI template (``schema``: the model's arguments)."""
    return template(slug, kind="cli", argv=argv,
                    parameters_schema=schema or {"type": "object", "properties": {}}, **fields)
