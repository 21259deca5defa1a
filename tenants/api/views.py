"""Authentication endpoints for the SPA, token management for scripts, the tenant pick,
invitations and the audit log.

- ``POST auth/login/`` (CSRF-checked, login lockout), ``POST auth/logout/``, ``GET auth/me/``
- ``GET auth/tenants/`` the caller's tenants; ``POST auth/tenant/ {tenant: slug}`` picks the
  default one (where the SPA lands after login)
- ``GET/POST tokens/``, ``POST tokens/<id>/revoke/``
- ``GET/POST admin/invitations/``, ``DELETE admin/invitations/<id>/`` (owners/admins);
  ``POST invitations/accept/ {token}`` (the invited, logged-in user)
- ``GET admin/memberships/``, ``GET/PATCH/DELETE admin/memberships/<id>/`` (owners/admins):
  members and their roles (the user of a membership never changes)
- ``GET admin/audit/`` (owners/admins): the tenant's audit log, paginated, newest first
"""

from __future__ import annotations

from django.contrib.auth import authenticate, login, logout
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import permissions, serializers, status
from rest_framework.authentication import CSRFCheck
from rest_framework.exceptions import PermissionDenied, Throttled
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent_platform.api_errors import ApplicationError, NotFound
from agent_platform.api_schema import StrictCharField
from tenants.api.mixins import IsTenantAdmin, TenantScopedApiView
from tenants.audit import audit_context, context_for_request
from tenants.lockout import LOCKED_OUT_MESSAGE, retry_after_seconds
from tenants.models import ApiToken, AuditEvent, Invitation, Membership, Role, Tenant
from tenants.selectors import audit_event_list, invitation_list, membership_for_user, membership_list_for_user
from tenants.services import (
    api_token_create,
    api_token_revoke,
    invitation_accept,
    invitation_create,
    invitation_revoke,
    membership_delete,
    membership_select,
    membership_update_role,
    tenant_settings_update,
)
from tenants.throttling import ClientIpThrottle


def enforce_csrf(request: Request) -> None:
    """Django's CSRF check (token and Origin/Referer) on a view DRF exempted from it.

    Raises:
        PermissionDenied: 403 ``CSRF Failed: …`` (a cross-site form or script; the SPA sends
            the ``csrftoken`` cookie's value as ``X-CSRFToken``).
    """
    check = CSRFCheck(lambda _request: None)
    check.process_request(request._request)
    reason = check.process_view(request._request, None, (), {})
    if reason:
        raise PermissionDenied(f"CSRF Failed: {reason}")


class _MeSerializer(serializers.Serializer):
    user = serializers.DictField()
    tenant = serializers.DictField()
    role = serializers.CharField()


def _me(request: Request, membership) -> dict:
    return {
        "user": {"id": request.user.pk, "username": request.user.get_username()},
        "tenant": {"id": membership.tenant_id, "name": membership.tenant.name, "slug": membership.tenant.slug},
        "role": membership.role,
    }


class AuthLoginApi(APIView):
    """Log in with username and password (session cookie). Only users with a membership.

    A cookie login, so CSRF-checked like a form (a cross-site page cannot log the browser in
    as someone else). After ``AXES_FAILURE_LIMIT`` failures for one username from one address
    the pair is locked out for the cool-off: 429 with ``Retry-After``, even with the right
    password; attempts per client address are throttled too (``login.ip``, many usernames from
    one address). Lands in the user's default tenant (the one they picked last).
    """

    permission_classes = [permissions.AllowAny]
    throttle_classes = [ClientIpThrottle]
    throttle_scope = "login"  # API_THROTTLE_RATES["login.ip"]: attempts per client address

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "LoginInput"

        username = serializers.CharField()
        password = serializers.CharField(style={"input_type": "password"})

    @extend_schema(request=InputSerializer, responses=_MeSerializer)
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        enforce_csrf(request)
        with audit_context(context_for_request(request, source="auth")):
            user = authenticate(request._request, username=data.validated_data["username"],
                                password=data.validated_data["password"])
        if user is None:
            if getattr(request._request, "axes_locked_out", False):
                raise Throttled(wait=retry_after_seconds(request._request), detail=LOCKED_OUT_MESSAGE)
            raise ApplicationError("Wrong username or password.")
        membership = membership_for_user(user=user)
        if membership is None:
            raise ApplicationError("This user is not a member of any tenant.", status_code=status.HTTP_403_FORBIDDEN)
        login(request._request, user)
        request.user = user
        return Response(_me(request, membership))


class _LogoutSerializer(serializers.Serializer):
    provider_logout_url = serializers.CharField(
        allow_null=True, help_text="A session that started with single sign-on: open this URL to sign out of the "
                                   "provider as well (OpenID Connect RP-Initiated Logout); else null.")


class AuthLogoutApi(APIView):
    """End the session (CSRF-checked, like the login); for a single sign-on session, also the
    URL that signs out of the provider (:func:`tenants.oidc.provider.provider_logout_url`)."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(request=None, responses=_LogoutSerializer)
    def post(self, request: Request) -> Response:
        from tenants.oidc.provider import PROVIDER_LOGOUT_ATTRIBUTE

        enforce_csrf(request)
        logout(request._request)
        return Response({"provider_logout_url": getattr(request._request, PROVIDER_LOGOUT_ATTRIBUTE, None)})


class AuthMeApi(TenantScopedApiView):
    """Who is calling, in which tenant, with which role."""

    @extend_schema(responses=_MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(_me(request, request.membership))


class ApiTokenOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]


class ApiTokenListCreateApi(TenantScopedApiView):
    """The caller's own API tokens; POST issues one (the raw token is in the response, once).

    Issuing is throttled per user and per tenant (``API_THROTTLE_RATES`` ``tokens.*``)."""

    throttle_scopes = ("tokens",)

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TokenCreateInput"

        name = StrictCharField(max_length=100, required=False, allow_blank=True, default="")

    @extend_schema(responses=ApiTokenOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        tokens = ApiToken.objects.filter(membership=request.membership)
        return Response(ApiTokenOutputSerializer(tokens, many=True).data)

    @extend_schema(request=InputSerializer, responses={201: ApiTokenOutputSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = api_token_create(membership=request.membership, name=data.validated_data["name"])
        return Response(
            {**ApiTokenOutputSerializer(issued.token).data, "token": issued.raw}, status=status.HTTP_201_CREATED
        )


class ApiTokenRevokeApi(TenantScopedApiView):
    @extend_schema(request=None, responses=ApiTokenOutputSerializer)
    def post(self, request: Request, token_id: int) -> Response:
        token = ApiToken.objects.filter(pk=token_id, membership=request.membership).first()
        if token is None:
            raise NotFound("Token not found.")
        return Response(ApiTokenOutputSerializer(api_token_revoke(token=token)).data)


class TenantChoiceSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    slug = serializers.CharField()
    role = serializers.CharField()
    default = serializers.BooleanField()


class AuthTenantListApi(APIView):
    """The caller's tenants (session or token user), default (the last picked) first."""

    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(responses=TenantChoiceSerializer(many=True))
    def get(self, request: Request) -> Response:
        memberships = membership_list_for_user(user=request.user)
        return Response([
            {"id": m.tenant_id, "name": m.tenant.name, "slug": m.tenant.slug, "role": m.role, "default": i == 0}
            for i, m in enumerate(memberships)
        ])


class AuthTenantPickApi(APIView):
    """Pick the caller's default tenant (``{tenant: slug}``): where they land after the next
    login and what session requests without ``X-Tenant`` use. 404 if not a member."""

    permission_classes = [permissions.IsAuthenticated]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TenantPickInput"

        tenant = serializers.SlugField(max_length=100)

    @extend_schema(request=InputSerializer, responses=_MeSerializer)
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = membership_for_user(user=request.user, tenant_slug=data.validated_data["tenant"])
        if membership is None:
            raise NotFound("Tenant not found.")
        membership_select(membership=membership)
        return Response(_me(request, membership))


class InvitationOutputSerializer(serializers.ModelSerializer):
    state = serializers.CharField(read_only=True)
    created_by = serializers.SerializerMethodField()

    class Meta:
        model = Invitation
        fields = ["id", "username", "email", "role", "prefix", "state", "created_by", "created_at", "expires_at",
                  "accepted_at", "revoked_at"]

    def get_created_by(self, invitation: Invitation) -> str | None:
        return invitation.created_by.get_username() if invitation.created_by_id else None


class InvitationCreatedSerializer(InvitationOutputSerializer):
    token = serializers.CharField(help_text="The invitation token (inv_…): shown once, hand it to the invited user.")

    class Meta(InvitationOutputSerializer.Meta):
        fields = [*InvitationOutputSerializer.Meta.fields, "token"]


class InvitationListCreateApi(TenantScopedApiView):
    """The tenant's invitations (owners/admins). POST ``{username | email, role}`` invites one
    user; the answer carries the token once (``token``), to hand to the invited user. Only
    owners may invite owners; a current member answers 409."""

    pagination_class = PageNumberPagination
    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "InvitationCreateInput"

        username = serializers.CharField(max_length=150, required=False, allow_blank=True, default="")
        email = serializers.EmailField(required=False, allow_blank=True, default="")
        role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)

    @extend_schema(responses=InvitationOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(invitation_list(), request, view=self)
        return paginator.get_paginated_response(InvitationOutputSerializer(page, many=True).data)

    @extend_schema(request=InputSerializer, responses={201: InvitationCreatedSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = invitation_create(tenant=request.tenant, created_by=request.user, inviter_role=request.membership.role,
                                   **data.validated_data)
        return Response({**InvitationOutputSerializer(issued.invitation).data, "token": issued.raw},
                        status=status.HTTP_201_CREATED)


class InvitationRevokeApi(TenantScopedApiView):
    """Withdraw a pending invitation of the tenant (owners/admins): 204; 404 not the tenant's;
    409 already accepted."""

    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]

    @extend_schema(responses={204: None})
    def delete(self, request: Request, invitation_id: int) -> Response:
        invitation = Invitation.objects.filter(pk=invitation_id).first()
        if invitation is None:
            raise NotFound("Invitation not found.")
        invitation_revoke(invitation=invitation)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationAcceptApi(APIView):
    """Accept an invitation (``{token}``) as the logged-in user it names: you become a member
    of its tenant with its role. 404 unknown/expired/used; 403 it names another user; 409
    already a member. Needs no membership (a user of another tenant, or of none)."""

    permission_classes = [permissions.IsAuthenticated]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "InvitationAcceptInput"

        token = serializers.CharField(max_length=200)

    @extend_schema(request=InputSerializer, responses={201: _MeSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with audit_context(context_for_request(request, source="api")):
            membership = invitation_accept(raw=data.validated_data["token"], user=request.user)
        return Response(_me(request, membership), status=status.HTTP_201_CREATED)


class AuditEventOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "at", "action", "source", "actor", "actor_repr", "object_type", "object_id", "object_repr",
                  "changes", "detail", "ip_address"]


class AuditEventListApi(TenantScopedApiView):
    """The tenant's audit log (owners/admins), newest first, paginated. Filters: ``action``,
    ``actor`` (user id), ``object_type`` (``app_label.model``). Read-only: there is no way to
    add, change or delete an event."""

    pagination_class = PageNumberPagination
    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]

    @extend_schema(
        parameters=[
            OpenApiParameter("action", str, description="e.g. create, update, delete, login_failed, token_revoked"),
            OpenApiParameter("actor", int, description="The acting user's id."),
            OpenApiParameter("object_type", str, description="app_label.model, e.g. llm.modelprovider"),
            OpenApiParameter("page", int),
        ],
        responses=AuditEventOutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        actor = request.query_params.get("actor")
        if actor is not None and not (actor.isascii() and actor.isdigit() and len(actor) < 19):
            raise ApplicationError("`actor` must be a user id.", extra={"fields": {"actor": ["A positive integer."]}})
        events = audit_event_list(action=request.query_params.get("action") or None,
                                  actor_id=int(actor) if actor is not None else None,
                                  object_type=request.query_params.get("object_type") or None)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(AuditEventOutputSerializer(page, many=True).data)


class MembershipOutputSerializer(serializers.ModelSerializer):
    user = serializers.SerializerMethodField()

    class Meta:
        model = Membership
        fields = ["id", "user", "role", "created_at", "last_selected_at"]

    @extend_schema_field(inline_serializer("MembershipUser", {"id": serializers.IntegerField(),
                                                              "username": serializers.CharField()}))
    def get_user(self, membership: Membership) -> dict:
        return {"id": membership.user_id, "username": membership.user.get_username()}


class MembershipListApi(TenantScopedApiView):
    """The tenant's members (owners/admins), oldest first, paginated. New members come from
    invitations (``admin/invitations/``) or the console."""

    pagination_class = PageNumberPagination
    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]

    @extend_schema(responses=MembershipOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(Membership.objects.select_related("user").order_by("created_at", "id"),
                                           request, view=self)
        return paginator.get_paginated_response(MembershipOutputSerializer(page, many=True).data)


class MembershipDetailApi(TenantScopedApiView):
    """One membership of the tenant (owners/admins). PATCH ``{role}`` changes the role; the user
    and tenant never change (a body naming them is a 400). DELETE removes the member. Only
    owners make, change or remove owners (403); the last owner stays (409); another tenant's
    membership is a 404."""

    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "MembershipUpdateInput"

        role = serializers.ChoiceField(choices=Role.choices)

    def _get(self, membership_id: int) -> Membership:
        membership = Membership.objects.select_related("user").filter(pk=membership_id).first()
        if membership is None:
            raise NotFound("Membership not found.")
        return membership

    @extend_schema(responses=MembershipOutputSerializer)
    def get(self, request: Request, membership_id: int) -> Response:
        return Response(MembershipOutputSerializer(self._get(membership_id)).data)

    @extend_schema(request=InputSerializer, responses=MembershipOutputSerializer)
    def patch(self, request: Request, membership_id: int) -> Response:
        membership = self._get(membership_id)
        moved = sorted({"user", "tenant", "user_id", "tenant_id"} & set(request.data if isinstance(request.data, dict)
                                                                            else {}))
        if moved:
            raise ApplicationError("A membership's user and tenant cannot change; invite the user instead.",
                                   extra={"fields": {name: ["Read-only."] for name in moved}})
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = membership_update_role(membership=membership, role=data.validated_data["role"],
                                            actor_role=request.membership.role)
        return Response(MembershipOutputSerializer(membership).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, membership_id: int) -> Response:
        membership_delete(membership=self._get(membership_id), actor_role=request.membership.role)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantSettingsOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        ref_name = "TenantSettings"
        fields = ["id", "name", "slug", "record_llm_bodies", "llm_body_retention_days", "trace_content"]
        read_only_fields = fields


class TenantSettingsApi(TenantScopedApiView):
    """The caller's tenant's own settings (owners/admins): GET; PATCH ``{record_llm_bodies?,
    llm_body_retention_days?}`` changes them (audited). ``record_llm_bodies``: keep the exact
    request and response bodies of the tenant's model calls (its admins read them in the
    console's run trace) for ``llm_body_retention_days`` days (1–90); off deletes what was kept
    within the hour. ``name``, ``slug`` and ``trace_content`` are the operator's (read-only
    here: a body naming them is a 400)."""

    permission_classes = [permissions.IsAuthenticated, IsTenantAdmin]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TenantSettingsUpdateInput"

        record_llm_bodies = serializers.BooleanField(required=False)
        llm_body_retention_days = serializers.IntegerField(required=False, min_value=1, max_value=90)

    def _tenant(self, request: Request) -> Tenant:
        return Tenant.objects.get(pk=request.membership.tenant_id)

    @extend_schema(responses=TenantSettingsOutputSerializer)
    def get(self, request: Request) -> Response:
        return Response(TenantSettingsOutputSerializer(self._tenant(request)).data)

    @extend_schema(request=InputSerializer, responses=TenantSettingsOutputSerializer)
    def patch(self, request: Request) -> Response:
        fixed = sorted(set(request.data if isinstance(request.data, dict) else {}) - set(self.InputSerializer().fields))
        if fixed:
            raise ApplicationError("Only record_llm_bodies and llm_body_retention_days can be changed here.",
                                   extra={"fields": {name: ["Read-only."] for name in fixed}})
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = tenant_settings_update(tenant=self._tenant(request), **data.validated_data)
        return Response(TenantSettingsOutputSerializer(tenant).data)
