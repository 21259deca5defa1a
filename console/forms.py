"""Console forms for capability bindings: a built-in tool chosen from a list, allowed tools
picked from the MCP server's tool list, the approval policy edited as rows.

Everything works without script (plain selects, a comma-separated list, rows of inputs);
``console/console.js`` adds checkboxes for the tools, an "Add a rule" button and shows only
the fields of the chosen kind.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from agents.models import ApprovalAction, CapabilityBinding, approval_policy_errors
from capabilities.registry import kind_fields


def builtin_choices() -> list[tuple[str, str]]:
    """``[("", "---------"), (name, "name — what it does"), ...]`` from the built-in registry."""
    from capabilities.builtin.registry import builtin_create, builtin_names

    choices = [("", "---------")]
    for name in sorted(builtin_names()):
        try:
            description = builtin_create(name).spec.description
        except Exception:  # a tool that cannot be built here still can be chosen
            description = ""
        first = description.strip().split("\n")[0].split(". ")[0][:90]
        choices.append((name, f"{name} — {first}" if first else name))
    return choices


class ApprovalPolicyWidget(forms.Widget):
    """The approval policy as rows of (tool name pattern, action, the rule's other fields as a
    JSON object), plus empty rows to add.

    POST data: ``<name>-pattern-<i>``, ``<name>-action-<i>`` and ``<name>-options-<i>`` for
    i = 0, 1, …; rows with an empty pattern are dropped. The value is the list of rules:
    ``{"pattern", "action"}`` plus the options' keys (``approvers``, ``message``,
    ``timeout_seconds``, ``on_timeout``); options that are not a JSON object are kept as the
    text under ``"options"``, which the field's validation names as not a field of a rule.
    """

    blank_rows = 2

    def id_for_label(self, id_: str) -> str:
        return f"{id_}-pattern-0" if id_ else id_

    def format_value(self, value: Any) -> list[dict[str, str]]:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except ValueError:
                return []
        return [r for r in (value or []) if isinstance(r, dict)]

    def value_from_datadict(self, data: Any, files: Any, name: str) -> list[dict[str, str]]:
        rows, i = [], 0
        while f"{name}-pattern-{i}" in data:
            pattern = (data.get(f"{name}-pattern-{i}") or "").strip()
            action = data.get(f"{name}-action-{i}") or ApprovalAction.ASK
            if pattern:
                rows.append({"pattern": pattern, "action": action,
                             **_rule_options(data.get(f"{name}-options-{i}") or "")})
            i += 1
        return rows

    def value_omitted_from_data(self, data: Any, files: Any, name: str) -> bool:
        return f"{name}-pattern-0" not in data

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None) -> str:
        rows = self.format_value(value) + [{"pattern": "", "action": "ask"}] * self.blank_rows
        id_ = (attrs or {}).get("id") or f"id_{name}"
        body = []
        for i, rule in enumerate(rows):
            options = format_html_join(
                "", '<option value="{}"{}>{}</option>',
                ((a, " selected" if rule.get("action") == a else "", label)
                 for a, label in (("allow", "allow (run it)"), ("ask", "ask (a person approves each call)"),
                                  ("deny", "deny (never run it)"))),
            )
            extra = {k: v for k, v in rule.items() if k not in ("pattern", "action")}
            body.append(format_html(
                '<tr class="policy-row"><td><label class="visually-hidden" for="{id}-pattern-{i}">Rule {n}: tool name pattern</label>'
                '<input type="text" id="{id}-pattern-{i}" name="{name}-pattern-{i}" value="{pattern}" '
                'placeholder="e.g. delete_*" size="24"></td>'
                '<td><label class="visually-hidden" for="{id}-action-{i}">Rule {n}: action</label>'
                '<select id="{id}-action-{i}" name="{name}-action-{i}">{options}</select></td>'
                '<td><label class="visually-hidden" for="{id}-options-{i}">Rule {n}: approvers, message, timeout (JSON)</label>'
                '<input type="text" id="{id}-options-{i}" name="{name}-options-{i}" value="{extra}" size="40" '
                'placeholder=\'{{"approvers": {{"roles": ["admin"]}}, "timeout_seconds": 86400}}\'></td></tr>',
                id=id_, i=i, n=i + 1, name=name, pattern=rule.get("pattern", ""), options=options,
                extra=json.dumps(extra) if extra else "",
            ))
        return format_html(
            '<div class="policy-editor" data-policy-name="{}" data-policy-id="{}" id="{}-rules">'
            '<table class="policy-rows"><thead><tr><th scope="col">Tool name pattern</th><th scope="col">Action</th>'
            '<th scope="col">Ask: approvers, message, timeout (JSON)</th></tr></thead>'
            '<tbody>{}</tbody></table>'
            '<p class="help">First matching rule wins; no match: allow. Patterns: * any characters, ? one. '
            "Leave a pattern empty to remove its rule. An ask rule's JSON may set approvers "
            '({{"requester": true, "roles": ["admin"], "members": [user id or e-mail]}}), message, '
            "timeout_seconds and on_timeout (deny or approve).</p></div>",
            name, id_, id_, mark_safe("".join(body)),
        )


def _rule_options(text: str) -> dict[str, Any]:
    """A policy row's options: the JSON object typed (``{}`` when blank); anything else is kept
    as ``{"options": text}`` so that validation names it."""
    text = text.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"options": text}
    return value if isinstance(value, dict) else {"options": text}


class ApprovalPolicyField(forms.Field):
    """A list of ``{"pattern", "action"}`` rules (:class:`ApprovalPolicyWidget`)."""

    widget = ApprovalPolicyWidget

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> list[dict[str, str]]:
        if value in (None, ""):
            return []
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise forms.ValidationError("Not a list of rules.") from exc
        return value

    def validate(self, value: Any) -> None:
        super().validate(value)
        errors = approval_policy_errors(value)
        if errors:
            raise forms.ValidationError(errors)

    def has_changed(self, initial: Any, data: Any) -> bool:
        return (initial or []) != (data or [])


class ToolListWidget(forms.TextInput):
    """Allowed tools as a comma-separated list; carries each MCP server's last tool list
    (``data-server-tools``: ``{server_id: [{name, description}]}``) for the script's
    checkboxes."""

    def __init__(self, server_tools: dict[int, list[dict[str, str]]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.server_tools = server_tools or {}

    def format_value(self, value: Any) -> str:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return value
        return ", ".join(value or [])

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        attrs = {**(attrs or {}), "data-server-tools": json.dumps(self.server_tools), "class": "tool-list-input",
                 "size": 60, "placeholder": "empty: every tool of the capability"}
        return super().get_context(name, value, attrs)


class ToolListField(forms.Field):
    """Tool names, entered comma-separated (or ticked), stored as a JSON list."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> list[str]:
        if isinstance(value, list):
            return [str(v) for v in value]
        value = (value or "").strip()
        if value.startswith("["):  # a JSON list, as the field used to take
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                raise forms.ValidationError("Tool names separated by commas, or a JSON list of names.") from exc
            if not isinstance(parsed, list) or not all(isinstance(t, str) for t in parsed):
                raise forms.ValidationError("A JSON list of tool names.")
            return parsed
        return [t.strip() for t in value.split(",") if t.strip()]

    def has_changed(self, initial: Any, data: Any) -> bool:
        return list(initial or []) != self.to_python(data)


def server_tools_for(queryset: Any) -> dict[int, list[dict[str, str]]]:
    """``{server_id: [{name, description}]}`` from the MCP servers' ``tools_snapshot``."""
    return {
        s.pk: [{"name": t.get("name", ""), "description": (t.get("description") or "")[:120]}
               for t in (s.tools_snapshot or []) if isinstance(t, dict) and t.get("name")]
        for s in queryset
    }


class BindingForm(forms.ModelForm):
    """A capability binding in the console (its admin page and the agent page's inline)."""

    builtin_name = forms.ChoiceField(
        required=False, label="Built-in tool", choices=builtin_choices,
        help_text="Kind “Built-in tool”: the tool the agent gets.",
    )
    allowed_tools = ToolListField(
        label="Allowed tools",
        help_text="Tick the tools to expose (the MCP server's list from its last Test connection), or type names "
                  "separated by commas; none: every tool.",
    )
    approval_policy = ApprovalPolicyField(label="Approval policy")

    class Meta:
        model = CapabilityBinding
        fields = "__all__"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        server_field = self.fields.get("mcp_server")
        servers = server_field.queryset if server_field is not None else []
        self.fields["allowed_tools"].widget = ToolListWidget(server_tools=server_tools_for(servers))
        if "kind" in self.fields:
            self.fields["kind"].widget.attrs["data-binding-kind"] = json.dumps(kind_fields())  # each kind's fields, from the registry
