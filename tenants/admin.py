"""Console pages of the tenants app: tenants (superusers), memberships, invitations, API
tokens and the audit log.

Tenant admins see their tenants' rows only (:mod:`tenants.admin_scoping`). A membership's
user and tenant are read-only once it exists; a new membership names a user who already has a
membership in one of the admin's tenants, or creates a new user. A user of another tenant
joins through an invitation. The audit log is read-only for everyone.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model, password_validation
from django.http import HttpRequest

from tenants.admin_scoping import TenantScopedModelAdmin, admin_tenants
from tenants.audit import AuditedModelAdminMixin
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Role, Tenant
from tenants.services import TENANT_SETTINGS_FIELDS, invitation_create, tenant_create


@admin.register(Tenant)
class TenantAdmin(AuditedModelAdminMixin, admin.ModelAdmin):
    """Tenants: superusers (the operator) create, change and delete any. A tenant's admins see
    their own tenants and change only the tenant's own settings (:data:`TENANT_SETTINGS_FIELDS`:
    its model call records); everything else is read-only to them."""

    list_display = ["name", "slug", "record_llm_bodies", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}

    def _tenant_admin(self, request: HttpRequest, obj: Any = None) -> bool:
        """An active staff user administering the tenant ``obj`` (any of theirs when None)."""
        user = request.user
        if not (user.is_active and user.is_staff):
            return False
        tenants = admin_tenants(request)
        return bool(tenants) if obj is None else obj.pk in tenants

    def get_queryset(self, request: HttpRequest) -> Any:
        qs = super().get_queryset(request)
        return qs if request.user.is_superuser else qs.filter(pk__in=admin_tenants(request))

    def has_module_permission(self, request):
        return request.user.is_superuser or self._tenant_admin(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser or self._tenant_admin(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser or self._tenant_admin(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if request.user.is_superuser:
            return super().get_readonly_fields(request, obj)
        return [f.name for f in Tenant._meta.fields if f.editable and f.name not in TENANT_SETTINGS_FIELDS]

    def get_prepopulated_fields(self, request: HttpRequest, obj: Any = None) -> dict[str, Any]:
        return super().get_prepopulated_fields(request, obj) if request.user.is_superuser else {}

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
        else:
            created = tenant_create(name=obj.name, slug=obj.slug)
            obj.pk, obj.wrapped_data_key = created.pk, created.wrapped_data_key


class MembershipAddForm(forms.ModelForm):
    """A new membership: an existing user (of the admin's tenants) or a new user."""

    new_username = forms.CharField(
        required=False, max_length=150, label="Or a new user: username",
        help_text="Creates a user who belongs to this tenant. Users of other tenants join by invitation.",
    )
    new_password = forms.CharField(required=False, label="New user's password", widget=forms.PasswordInput)

    class Meta:
        model = Membership
        fields = ["tenant", "user", "role"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "user" in self.fields:
            self.fields["user"].required = False

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        user, username = data.get("user"), (data.get("new_username") or "").strip()
        if bool(user) == bool(username):
            raise forms.ValidationError("Pick a user of your tenant, or give a new username (not both).")
        if username:
            User = get_user_model()
            if User._default_manager.filter(**{User.USERNAME_FIELD: username}).exists():
                self.add_error("new_username", "This username is taken. Invite that user instead.")
            password = data.get("new_password") or ""
            if not password:
                self.add_error("new_password", "A new user needs a password.")
            else:
                try:
                    password_validation.validate_password(password)
                except forms.ValidationError as exc:
                    self.add_error("new_password", exc)
        return data


@admin.register(Membership)
class MembershipAdmin(TenantScopedModelAdmin):
    list_display = ["user", "tenant", "role", "created_at", "last_selected_at"]
    search_fields = ["user__username", "user__email", "tenant__name"]
    list_filter = ["role"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = MembershipAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = list(super().get_readonly_fields(request, obj))
        if obj is not None:  # a membership's user and tenant never change (its tokens are theirs)
            readonly += ["user", "tenant"]
        return readonly

    def _owner_tenants(self, request: HttpRequest) -> set[int]:
        cached = getattr(request, "_owner_tenant_ids", None)
        if cached is None:
            cached = set(Membership.all_tenants.filter(  # tenant-bypass: the requester's own memberships
                user=request.user, role=Role.OWNER).values_list("tenant_id", flat=True))
            request._owner_tenant_ids = cached  # type: ignore[attr-defined]
        return cached

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_choice_field(db_field, request, **kwargs)
        if db_field.name == "role" and not request.user.is_superuser and not self._owner_tenants(request):
            field.choices = [c for c in field.choices if c[0] != Role.OWNER]  # only owners make owners
        return field

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.role == Role.OWNER and not request.user.is_superuser \
                and obj.tenant_id not in self._owner_tenants(request):
            return False  # only owners change or remove owners
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.role == Role.OWNER and not request.user.is_superuser \
                and obj.tenant_id not in self._owner_tenants(request):
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        username = (form.cleaned_data.get("new_username") or "").strip() if not change else ""
        if username:
            obj.user = get_user_model()._default_manager.create_user(
                username=username, password=form.cleaned_data["new_password"])
        super().save_model(request, obj, form, change)


@admin.register(ApiToken)
class ApiTokenAdmin(TenantScopedModelAdmin):
    list_display = ["prefix", "name", "membership", "created_at", "last_used_at", "revoked_at"]
    search_fields = ["name", "prefix", "membership__user__username"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]

    def has_add_permission(self, request, *args):
        return False  # issued through the API or seed_demo --print-token: the raw token is shown once

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = list(super().get_readonly_fields(request, obj))
        if obj is not None:  # a token stays with the membership it was issued to
            readonly += ["membership"]
        return readonly


@admin.register(Invitation)
class InvitationAdmin(TenantScopedModelAdmin):
    """Invitations: add one (the token is shown once, in a message), delete to withdraw."""

    list_display = ["username", "email", "role", "state", "created_by", "created_at", "expires_at", "accepted_by"]
    search_fields = ["username", "email"]
    list_filter = ["role"]
    fields = ["tenant", "username", "email", "role"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:
            return ["tenant", "username", "email", "role", "prefix", "created_by", "created_at", "expires_at",
                    "accepted_at", "accepted_by", "revoked_at"]
        return [f for f in self.fields if f not in self.get_exclude(request, obj)]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        tenant_id = obj.tenant_id or admin_tenants(request)[0]
        tenant = Tenant.objects.get(pk=tenant_id)
        inviter_role = None
        if not request.user.is_superuser:
            inviter_role = Membership.all_tenants.filter(  # tenant-bypass: the admin's own membership
                tenant_id=tenant_id, user=request.user).values_list("role", flat=True).first() or Role.MEMBER
        issued = invitation_create(tenant=tenant, created_by=request.user, role=obj.role, username=obj.username,
                                   email=obj.email, inviter_role=inviter_role)
        obj.__dict__.update({k: v for k, v in issued.invitation.__dict__.items() if not k.startswith("_")})
        obj._state.adding = False
        messages.warning(request, f"Invitation token (shown once; give it to the invited user, who accepts it "
                                  f"at POST /api/v1/invitations/accept/): {issued.raw}")

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        # invitation_create recorded the event (invitation_created); keep Django's LogEntry only.
        return self._with_flag(lambda: admin.ModelAdmin.log_addition(self, request, obj, message))


@admin.register(AuditEvent)
class AuditEventAdmin(TenantScopedModelAdmin):
    """The audit log, read-only for everyone (tenant admins: their tenants' events only;
    events of no tenant, e.g. failed logins of unknown usernames: superusers only)."""

    list_display = ["at", "action", "source", "actor_repr", "object_type", "object_repr", "ip_address", "tenant"]
    list_filter = ["action", "source", "object_type"]
    search_fields = ["actor_repr", "object_repr", "object_id"]
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
