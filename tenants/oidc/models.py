"""Single sign-on's one model: the link of a user to their account at the provider."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class OidcIdentity(models.Model):
    """A user's account at the operator's OpenID Connect provider (single sign-on).

    ``issuer`` and ``subject`` are the ID token's ``iss`` and ``sub``: together the one stable,
    unique identifier of an end user (OpenID Connect Core 1.0, §5.7; an e-mail address or a
    username may change or be reused, so they never link an account). Made by the first
    login through the provider (:func:`tenants.oidc.services.oidc_login_sync`); a user without
    one (a local account: operators, password users) is never signed in through the provider.
    Not tenant-owned: a user belongs to several tenants, as ``auth_user`` does.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    issuer = models.CharField(max_length=255, help_text="The provider's issuer identifier (the ID token's iss).")
    subject = models.CharField(max_length=255, help_text="The user's id at the provider (the ID token's sub).")
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True, help_text="The last sign-in through the provider.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="oidcidentity_unique_subject")]
        verbose_name = "OIDC identity"
        verbose_name_plural = "OIDC identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class OidcSession(models.Model):
    """A login session of this platform that started through the provider (single sign-on).

    Kept so that the provider can end it: a Back-Channel Logout token names the end user
    (``sub``) and/or the provider's session (``sid``), never this platform's session key
    (OpenID Connect Back-Channel Logout 1.0, §2.4–2.7;
    :func:`tenants.oidc.services.oidc_sessions_end`). Made at each login through the provider,
    removed when the session signs out or is ended that way. ``sid`` is the ID token's ``sid``
    claim ("" when the provider sends none). Not tenant-owned (as :class:`OidcIdentity`).
    """

    identity = models.ForeignKey(OidcIdentity, on_delete=models.CASCADE, related_name="sessions")
    sid = models.CharField(max_length=255, blank=True, default="",
                           help_text="The provider's session id (the ID token's sid), if it sent one.")
    session_key = models.CharField(max_length=40, unique=True, help_text="This platform's login session.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["identity", "sid"], name="oidcsession_identity_sid")]
        verbose_name = "OIDC session"
        verbose_name_plural = "OIDC sessions"

    def __str__(self) -> str:
        return f"session of {self.identity} (sid {self.sid or '-'})"
