import json
import re

from django import forms
from django.contrib import admin

from capabilities.models import CliCommand, McpServer, Skill
from tenants.admin_scoping import TenantScopedModelAdmin
from tenants.crypto import secret_encrypt_json
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


class McpServerForm(forms.ModelForm):
    env = _JsonSecretField(label="Environment (stdio)")
    headers = _JsonSecretField(label="Headers (HTTP)")

    class Meta:
        model = McpServer
        fields = "__all__"


@admin.register(McpServer)
class McpServerAdmin(TenantScopedModelAdmin):
    form = McpServerForm
    list_display = ["name", "alias", "transport", "enabled", "tenant"]

    def save_model(self, request, obj, form, change):
        if not obj.tenant_id:
            super().save_model(request, obj, form, change)
        tenant = Tenant.objects.get(pk=obj.tenant_id)
        for field in ("env", "headers"):
            value = form.cleaned_data.get(field)
            if value is not None:
                setattr(obj, f"{field}_encrypted", secret_encrypt_json(tenant=tenant, value=value))
        super().save_model(request, obj, form, change)


class CliCommandForm(forms.ModelForm):
    env = _JsonSecretField(label="Environment variables")

    def clean_env(self):
        value = self.cleaned_data.get("env")
        bad = [k for k in (value or {}) if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise forms.ValidationError(f"Not valid variable names: {', '.join(sorted(bad))}.")
        if any("\0" in v for v in (value or {}).values()):
            raise forms.ValidationError("Values may not contain NUL characters.")
        return value

    class Meta:
        model = CliCommand
        fields = "__all__"


@admin.register(CliCommand)
class CliCommandAdmin(TenantScopedModelAdmin):
    """CLI commands; the env is write-only and stored encrypted (like an MCP server's)."""

    form = CliCommandForm
    list_display = ["name", "program", "allow_network", "unsandboxed", "enabled", "tenant"]
    list_filter = ["enabled", "allow_network", "unsandboxed"]
    readonly_fields = ["env_is_set"]

    @admin.display(description="Program")
    def program(self, obj: CliCommand) -> str:
        return obj.argv_template[0] if obj.argv_template else ""

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
        from tenants.admin_scoping import _admin_tenants

        form = super().get_form(request, obj, change=change, **kwargs)
        tenants = _admin_tenants(request)
        form.tenant_id = tenants[0] if not request.user.is_superuser and len(tenants) == 1 else None
        return form

    def save_model(self, request, obj, form, change):
        parsed = getattr(form, "parsed", None)
        obj.source = parsed.source if parsed is not None else ""
        super().save_model(request, obj, form, change)
