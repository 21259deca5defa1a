from django.urls import path

from tenants.api import views

urlpatterns = [
    path("auth/login/", views.AuthLoginApi.as_view(), name="auth-login"),
    path("auth/logout/", views.AuthLogoutApi.as_view(), name="auth-logout"),
    path("auth/me/", views.AuthMeApi.as_view(), name="auth-me"),
    path("tokens/", views.ApiTokenListCreateApi.as_view(), name="token-list"),
    path("tokens/<int:token_id>/revoke/", views.ApiTokenRevokeApi.as_view(), name="token-revoke"),
    path("auth/tenants/", views.AuthTenantListApi.as_view(), name="auth-tenants"),
    path("auth/tenant/", views.AuthTenantPickApi.as_view(), name="auth-tenant-pick"),
    path("admin/invitations/", views.InvitationListCreateApi.as_view(), name="admin-invitation-list"),
    path("admin/invitations/<int:invitation_id>/", views.InvitationRevokeApi.as_view(), name="admin-invitation-detail"),
    path("invitations/accept/", views.InvitationAcceptApi.as_view(), name="invitation-accept"),
    path("admin/audit/", views.AuditEventListApi.as_view(), name="admin-audit"),
    path("admin/tenant/", views.TenantSettingsApi.as_view(), name="admin-tenant-settings"),
    path("admin/memberships/", views.MembershipListApi.as_view(), name="admin-membership-list"),
    path("admin/memberships/<int:membership_id>/", views.MembershipDetailApi.as_view(), name="admin-membership-detail"),
]
