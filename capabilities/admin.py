"""Console for capabilities. MCP servers: secrets write-only, the tool snapshot, and "Test connection"."""

import json
import re

from django import forms
from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from capabilities.catalogue import ProgramTemplate, TemplateKind, parameters_errors, secrets_errors
from capabilities.mcp_test_request import mcp_server_test_connection_request
from capabilities.models import CliCommand, Command, McpServer, McpTransport, Skill
from tenants.admin_scoping import TenantScopedModelAdmin
from tenants.crypto import secret_encrypt, secret_encrypt_json
from tenants.models import Tenant


class _JsonSecretField(forms.CharField):
    def __init__(self, **kwargs):
        super().__init__(
            required=False, widget=forms.Textarea(attrs={"rows": 3}),
            help_text='Write-only JSON object, e.g. {"NAME": "value"}. Blank keeps the stored value; {} clears it.',
            **kwargs,
        )

    def clean(self, value):
        value = super().clean(value)
        if not value.strip():
            return None
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise forms.ValidationError(f"Not JSON: {exc}") from exc
        if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
            raise forms.ValidationError("A JSON object of strings.")
        return parsed


def _template_help(kind: str) -> str:
    return ("A program from the operator's catalogue (Capabilities → Program templates): its command line, "
            "sandbox and network are the operator's; you fill in its parameters and secrets.")


class _TemplateFormMixin:
    """Checks the tenant's parameters and secrets against the chosen template."""

    def _check_template(self, data: dict, *, secrets_field: str = "env") -> None:
        template = data.get("template")
        if template is None:
            return
        problems = parameters_errors(template, data.get("parameters") or {})
        if problems:
            self.add_error("parameters", problems)  # type: ignore[attr-defined]
        problems = secrets_errors(template, data.get(secrets_field))
        if problems:
            self.add_error(secrets_field, problems)  # type: ignore[attr-defined]


class McpServerForm(_TemplateFormMixin, forms.ModelForm):
    env = _JsonSecretField(label="Secrets (stdio)")
    headers = _JsonSecretField(label="Headers (HTTP)")
    oauth_client_secret = forms.CharField(
        required=False, label="OAuth client secret", widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: the secret of the OAuth client id above. Blank keeps the stored one.",
    )
    oauth_private_key = forms.CharField(
        required=False, label="OAuth client private key", widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Write-only, for the client-credentials auth mode without a secret: the client's PEM private "
                  "key (private_key_jwt, RFC 7523). Blank keeps the stored one.",
    )

    class Meta:
        model = McpServer
        fields = "__all__"
        help_texts = {"template": _template_help("mcp_stdio")}

    def clean(self):
        data = super().clean()
        if data.get("transport") == McpTransport.STDIO:
            self._check_template(data)
        elif data.get("env"):
            self.add_error("env", "Only a stdio server has secrets; an HTTP server has headers.")
        return data


def _admin_tenant_ids(request: HttpRequest) -> list[int]:
    """The tenants the console user administers (none when logged out)."""
    from tenants.selectors import admin_tenant_ids

    return admin_tenant_ids(user=request.user) if request.user.is_authenticated else []


def _templates_for(request: HttpRequest, kind: str):
    """Enabled templates of ``kind`` that the admin's tenants may use (all of them for a superuser)."""
    from django.db.models import Q

    qs = ProgramTemplate.objects.filter(kind=kind, enabled=True)
    if request.user.is_superuser:
        return qs
    tenants = _admin_tenant_ids(request)
    return qs.filter(Q(tenants__isnull=True) | Q(tenants__in=tenants)).distinct()


@admin.register(ProgramTemplate)
class ProgramTemplateAdmin(admin.ModelAdmin):
    """The operator catalogue: only superusers (platform operators) add, change or delete
    templates; tenant admins may read them, to know what they can enable."""

    list_display = ["name", "slug", "kind", "network", "enabled", "updated_at"]
    list_filter = ["kind", "network", "enabled"]
    search_fields = ["name", "slug", "description"]
    filter_horizontal = ["tenants"]

    def _staff(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff and (
            request.user.is_superuser or bool(_admin_tenant_ids(request)))

    def get_queryset(self, request):
        from django.db.models import Q

        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(Q(tenants__isnull=True) | Q(tenants__in=_admin_tenant_ids(request))).distinct()

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self._staff(request)

    def has_view_permission(self, request: HttpRequest, obj=None) -> bool:
        return self._staff(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser


def _tools_table(tools: list[dict]) -> str:
    """An HTML table of ``[{name, description}]`` (escaped)."""
    if not tools:
        return format_html("<em>{}</em>", "No tools listed yet.")
    rows = format_html_join(
        "", "<tr><td><code>{}</code></td><td>{}</td></tr>", ((t.get("name", ""), t.get("description", "")) for t in tools)
    )
    return format_html('<table class="mcp-tools"><thead><tr><th>Tool</th><th>Description</th></tr></thead>'
                       "<tbody>{}</tbody></table>", rows)


@admin.register(McpServer)
class McpServerAdmin(TenantScopedModelAdmin):
    """MCP servers of the admin's tenants; the change page shows the last tool snapshot and a
    "Test connection" button (connect with the server's timeouts, list, store the snapshot)."""
    search_fields = ["name", "alias", "url"]  # the console: search on every list

    form = McpServerForm

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "template":
            kwargs["queryset"] = _templates_for(request, TemplateKind.MCP_STDIO)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    list_display = ["name", "alias", "transport", "enabled", "tool_count", "tools_snapshot_at", "tenant"]
    readonly_fields = ["tools_snapshot_table", "tools_snapshot_at", "last_error", "oauth_connection"]
    change_form_template = "admin/capabilities/mcpserver/change_form.html"

    @admin.display(description="OAuth connection")
    def oauth_connection(self, obj: McpServer) -> str:
        from capabilities.mcp_oauth.console import connection_summary

        return connection_summary(obj) if obj.pk else "-"

    @admin.display(description="Tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools_snapshot or [])

    @admin.display(description="Tools (last snapshot)")
    def tools_snapshot_table(self, obj: McpServer) -> str:
        return _tools_table(obj.tools_snapshot or [])

    def get_urls(self):
        info = self.model._meta.app_label, self.model._meta.model_name
        return [
            path("<path:object_id>/test-connection/", self.admin_site.admin_view(self.test_connection_view),
                 name="{}_{}_test_connection".format(*info)),
            path("<path:object_id>/oauth-connect/", self.admin_site.admin_view(self.oauth_view("connect")),
                 name="{}_{}_oauth_connect".format(*info)),
            path("<path:object_id>/oauth-disconnect/", self.admin_site.admin_view(self.oauth_view("disconnect")),
                 name="{}_{}_oauth_disconnect".format(*info)),
        ] + super().get_urls()

    def oauth_view(self, action: str):
        """Connect / Disconnect the server's OAuth account (capabilities/mcp_oauth/console.py);
        another tenant's server is a 404 (the queryset is scoped to the admin's tenants)."""
        from capabilities.mcp_oauth.console import console_connect, console_disconnect

        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            server = self.get_object(request, object_id)
            if server is not None and not self.has_change_permission(request, server):
                server = None
            return (console_connect if action == "connect" else console_disconnect)(request, server)
        return view

    def test_connection_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the stored snapshot and a button; POST: test now and show the tools or the error.

        Another tenant's server is a 404 (the queryset is scoped to the admin's tenants).
        """
        server = self.get_object(request, object_id)
        if server is None or not self.has_change_permission(request, server):
            raise Http404("MCP server not found.")
        result = None
        if request.method == "POST":
            result = mcp_server_test_connection_request(server=server)  # on a worker
            server.refresh_from_db()
        elif request.method != "GET":
            return redirect(reverse("admin:capabilities_mcpserver_test_connection", args=[server.pk]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "original": server,
            "title": f"Test connection: {server.name}",
            "result": result,
            "tools_table": _tools_table(
                [{"name": t.name, "description": t.description} for t in result.tools]
                if result is not None and result.ok else server.tools_snapshot or []
            ),
        }
        return TemplateResponse(request, "admin/capabilities/mcpserver/test_connection.html", context)

    def save_model(self, request, obj, form, change):
        if not obj.tenant_id:
            super().save_model(request, obj, form, change)
        tenant = Tenant.objects.get(pk=obj.tenant_id)
        for field in ("env", "headers"):
            value = form.cleaned_data.get(field)
            if value is not None:
                setattr(obj, f"{field}_encrypted", secret_encrypt_json(tenant=tenant, value=value))
        if form.cleaned_data.get("oauth_client_secret"):
            obj.oauth_client_secret_encrypted = secret_encrypt(tenant=tenant,
                                                               plaintext=form.cleaned_data["oauth_client_secret"])
        if form.cleaned_data.get("oauth_private_key"):
            obj.oauth_private_key_encrypted = secret_encrypt(tenant=tenant,
                                                             plaintext=form.cleaned_data["oauth_private_key"])
        super().save_model(request, obj, form, change)


class CliCommandForm(_TemplateFormMixin, forms.ModelForm):
    env = _JsonSecretField(label="Secrets")

    def clean_env(self):
        value = self.cleaned_data.get("env")
        bad = [k for k in (value or {}) if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise forms.ValidationError(f"Not valid variable names: {', '.join(sorted(bad))}.")
        if any("\0" in v for v in (value or {}).values()):
            raise forms.ValidationError("Values may not contain NUL characters.")
        return value

    def clean(self):
        data = super().clean()
        self._check_template(data)
        return data

    class Meta:
        model = CliCommand
        fields = "__all__"
        help_texts = {"template": _template_help("cli")}


@admin.register(CliCommand)
class CliCommandAdmin(TenantScopedModelAdmin):
    """CLI commands: a program template of the operator's catalogue under a tool name; the secrets
    are write-only and stored encrypted (like an MCP server's)."""
    search_fields = ["name", "description"]  # the console: search on every list

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "template":
            kwargs["queryset"] = _templates_for(request, TemplateKind.CLI)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    form = CliCommandForm
    list_display = ["name", "template", "network", "enabled", "tenant"]
    list_filter = ["enabled"]
    readonly_fields = ["env_is_set"]

    @admin.display(description="Network")
    def network(self, obj: CliCommand) -> str:
        return obj.template.get_network_display() if obj.template else ""

    @admin.display(description="Environment stored", boolean=True)
    def env_is_set(self, obj: CliCommand) -> bool:
        return bool(obj.env_encrypted)

    def save_model(self, request, obj, form, change):
        value = form.cleaned_data.get("env")
        if value is not None:
            if not obj.tenant_id:
                super().save_model(request, obj, form, change)  # assigns the tenant
            obj.env_encrypted = secret_encrypt_json(tenant=Tenant.objects.get(pk=obj.tenant_id), value=value)
        super().save_model(request, obj, form, change)


class SkillForm(forms.ModelForm):
    """Edit a skill field by field, or paste a whole SKILL.md (it then overrides the fields).

    ``tenant_id`` (set by :class:`SkillAdmin` for admins of one tenant) lets the form check
    the name's uniqueness and resolve ``model_route`` by name before saving.
    """

    tenant_id: int | None = None

    skill_md = forms.CharField(
        label="Paste a SKILL.md", required=False, widget=forms.Textarea(attrs={"rows": 12, "cols": 100}),
        help_text="Optional: front matter (name, description, allowed_tools, model_route, max_loop_count) "
                  "and instructions. When given, it replaces the fields below.",
    )

    class Meta:
        model = Skill
        fields = ["skill_md", "tenant", "name", "description", "instructions", "allowed_tools", "model_route",
                  "max_loop_count"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("name", "description", "instructions"):
            if name in self.fields:
                self.fields[name].required = False  # a pasted SKILL.md may supply them

    def clean(self):
        from capabilities.skills.parsing import SkillParseError, skill_parse
        from llm.models import ModelRoute

        data = super().clean()
        tenant = data.get("tenant")
        tenant_id = tenant.pk if tenant is not None else (self.instance.tenant_id or self.tenant_id)
        text = (data.get("skill_md") or "").strip()
        self.parsed = None
        if text:
            try:
                parsed = skill_parse(text)
            except SkillParseError as exc:
                raise forms.ValidationError({"skill_md": str(exc)}) from exc
            route = None
            if parsed.model_route:
                # tenant-bypass: resolved within the skill's tenant only.
                route = ModelRoute.all_tenants.filter(tenant_id=tenant_id, name=parsed.model_route).first()
                if route is None:
                    raise forms.ValidationError(
                        {"skill_md": f"'model_route': the tenant has no model route named {parsed.model_route!r}."})
            data.update(name=parsed.name, description=parsed.description, instructions=parsed.instructions,
                        allowed_tools=parsed.allowed_tools, max_loop_count=parsed.max_loop_count or 8,
                        model_route=route)
            self.parsed = parsed
        else:
            for name in ("name", "description", "instructions"):
                if not data.get(name):
                    self.add_error(name, "This field is required (or paste a SKILL.md).")
        name = data.get("name")
        # tenant-bypass: uniqueness within the skill's tenant (the constraint names the tenant,
        # which the form may not show).
        if name and tenant_id and Skill.all_tenants.filter(tenant_id=tenant_id, name=name).exclude(
            pk=self.instance.pk
        ).exists():
            self.add_error("skill_md" if text else "name", f"The tenant already has a skill named {name!r}.")
        return data


@admin.register(Skill)
class SkillAdmin(TenantScopedModelAdmin):
    form = SkillForm
    list_display = ["name", "description", "model_route", "max_loop_count", "tenant", "updated_at"]
    search_fields = ["name", "description"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        from tenants.admin_scoping import admin_tenants

        form = super().get_form(request, obj, change=change, **kwargs)
        tenants = admin_tenants(request)
        form.tenant_id = tenants[0] if not request.user.is_superuser and len(tenants) == 1 else None
        return form

    def save_model(self, request, obj, form, change):
        parsed = getattr(form, "parsed", None)
        obj.source = parsed.source if parsed is not None else ""
        super().save_model(request, obj, form, change)


class CommandForm(forms.ModelForm):
    """A slash command in the console: the arguments as JSON; the name checked against the
    tenant's other commands (the unique constraint names the tenant, which the form may not show)."""

    class Meta:
        model = Command
        fields = ["tenant", "name", "description", "template", "arguments"]
        widgets = {"arguments": forms.Textarea(attrs={"rows": 5, "class": "vLargeTextField"})}

    def clean(self):
        data = super().clean()
        tenant = data.get("tenant")
        tenant_id = tenant.pk if tenant is not None else self.instance.tenant_id
        name = data.get("name")
        # tenant-bypass: uniqueness within the command's tenant.
        if name and tenant_id and Command.all_tenants.filter(tenant_id=tenant_id, name=name).exclude(
            pk=self.instance.pk
        ).exists():
            self.add_error("name", f"The tenant already has a command named /{name}.")
        return data


@admin.register(Command)
class CommandAdmin(TenantScopedModelAdmin):
    """Slash commands. Bind one to an agent on the agent's page: a binding of kind "Slash
    command" with config ``{"command": <id>}`` (the id is in this page's address)."""

    form = CommandForm
    list_display = ["name", "description", "tenant", "updated_at"]
    search_fields = ["name", "description", "template"]
    readonly_fields = ["bound_to"]

    @admin.display(description="Bound to agents")
    def bound_to(self, obj: Command) -> str:
        """The agents whose bindings name this command (how to bind one, when none does)."""
        from django.apps import apps

        if obj.pk is None:
            return "Save the command first, then bind it on an agent's page."
        binding_model = apps.get_model("agents", "CapabilityBinding")
        # tenant-bypass: the command's own tenant (the console already scoped the command).
        names = sorted({b.agent.name for b in binding_model.all_tenants.filter(
            tenant_id=obj.tenant_id, kind="command", config__command=obj.pk).select_related("agent")})
        hint = f'Bind it on an agent\'s page: a binding of kind "Slash command" with config {{"command": {obj.pk}}}.'
        return f"{', '.join(names)}. {hint}" if names else f"No agent yet. {hint}"
