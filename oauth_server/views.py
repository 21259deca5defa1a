"""The authorization server's pages and documents.

- :class:`ConsentView` (``/oauth/authorize/``): DOT's authorization view with the platform's
  rules: PKCE ``S256`` only, exactly one ``resource`` naming one of our MCP endpoints, a login
  (the chat app's own sign-in: ``/?next=<this request>``, which returns here), and the user's
  choice of ONE membership (tenant) for the grant.
- :class:`ProtectedResourceMetadataView`: RFC 9728 documents, one per MCP endpoint.
- :class:`RegistrationView` (``/oauth/register/``): RFC 7591 registration (open, as MCP clients
  need), rate-limited per client address (``API_THROTTLE_RATES["oauth_register.ip"]``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.http import HttpRequest, HttpResponse, JsonResponse
from oauth2_provider.exceptions import OAuthToolkitError
from oauth2_provider.forms import AllowForm
from oauth2_provider.models import get_application_model
from oauth2_provider.views import AuthorizationView, OAuthProtectedResourceMetadataView, TokenView
from oauth2_provider.views.dynamic_client_registration import DynamicClientRegistrationView
from oauthlib.oauth2.rfc6749 import errors

from agent_platform.security_headers import HEADER as CSP_HEADER
from agent_platform.security_headers import policy_for_path
from oauth_server.redirects import csp_source, redirect_uri_problem
from oauth_server.resources import (
    MCP_RESOURCES,
    SCOPES,
    metadata_url,
    mount_of,
    origin,
    resource_mount,
    resource_url,
)
from tenants.audit import audit_context, context_for_request
from tenants.models import Membership
from tenants.scoping import system_scope

REGISTER_THROTTLE_SCOPE = "oauth_register"
"""Registrations per client address: ``API_THROTTLE_RATES["oauth_register.ip"]``."""


def _user_memberships(user: Any) -> list[Membership]:
    """The user's memberships with their tenants, oldest first."""
    # tenant-bypass: the signed-in user's own memberships (the choice offered on the consent page).
    with system_scope():
        return list(Membership.all_tenants.select_related("tenant").filter(user=user).order_by("created_at", "id"))


class ConsentForm(AllowForm):
    """DOT's form plus the membership the grant acts in (one of the user's)."""

    membership = forms.TypedChoiceField(
        coerce=int,
        required=False,
        widget=forms.RadioSelect,
        error_messages={"invalid_choice": "Choose the tenant this client acts in (one of yours)."},
    )

    def __init__(self, *args: Any, memberships: list[Membership] = (), **kwargs: Any) -> None:  # type: ignore[assignment]
        super().__init__(*args, **kwargs)
        self.memberships = {m.pk: m for m in memberships}
        self.fields["membership"].choices = [(m.pk, m.tenant.name) for m in memberships]
        if memberships:
            self.fields["membership"].initial = memberships[0].pk


def _target_error(description: str, redirect_uri: str | None, state: str | None) -> OAuthToolkitError:
    return OAuthToolkitError(
        error=errors.CustomOAuth2Error(error="invalid_target", description=description, state=state),
        redirect_uri=redirect_uri,
    )


def _request_error(description: str, redirect_uri: str | None, state: str | None) -> OAuthToolkitError:
    return OAuthToolkitError(
        error=errors.InvalidRequestError(description=description, state=state), redirect_uri=redirect_uri
    )


def _redirect_source(application: Any, redirect_uri: str) -> str:
    """The CSP source expression of ``redirect_uri`` (:func:`oauth_server.redirects.csp_source`:
    ``scheme://host[:port]``, or ``scheme:`` for a private-use scheme) when it is one of
    ``application``'s registered redirect URIs and passes the redirect rule, else ''."""
    if application is None or not redirect_uri or redirect_uri_problem(redirect_uri) is not None:
        return ""
    if not application.redirect_uri_allowed(redirect_uri):
        return ""
    return csp_source(redirect_uri)


class ConsentView(AuthorizationView):
    """The authorization endpoint and its consent page (GET shows it, POST decides).

    Refused before the page (an error redirect to the client's checked ``redirect_uri``):
    a ``code_challenge_method`` other than ``S256`` (``invalid_request``), no ``resource`` or
    more than one, or one that is not our MCP endpoint at this origin (``invalid_target``).
    A user without memberships gets the page saying so and cannot allow.
    """

    template_name = "oauth_server/consent.html"
    form_class = ConsentForm
    login_url = "/"  # the chat app's sign-in; after it, the app goes to ``next`` (app.js: oauthReturnPath)

    def _check_extensions(self, params: Any, credentials: dict[str, Any]) -> None:
        """Our rules on an authorization request (``params``: its GET or POST data)."""
        redirect_uri, state = credentials.get("redirect_uri"), credentials.get("state")
        if params.get("code_challenge_method") != "S256":
            raise _request_error(
                "PKCE is required with code_challenge_method=S256 (plain is refused).", redirect_uri, state
            )
        resources = params.getlist("resource") if hasattr(params, "getlist") else [params.get("resource")]
        resources = [r for value in resources if value for r in value.split()]
        if len(resources) != 1:
            raise _target_error("Name exactly one MCP endpoint as `resource` (RFC 8707).", redirect_uri, state)
        if resource_mount(resources[0], origin(self.request)) is None:
            raise _target_error(f"{resources[0]!r} is not an MCP endpoint of this server.", redirect_uri, state)

    def validate_authorization_request(self, request: HttpRequest) -> tuple[list[str], dict[str, Any]]:
        """DOT's validation (client, redirect URI, scopes), then :meth:`_check_extensions`."""
        scopes, credentials = super().validate_authorization_request(request)
        self._check_extensions(request.GET, credentials)
        return scopes, credentials

    def get_form_kwargs(self) -> dict[str, Any]:
        return {**super().get_form_kwargs(), "memberships": _user_memberships(self.request.user)}

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        resource = kwargs.get("resource") or self.oauth2_data.get("resource") or ""
        mount = mount_of(urlsplit(resource).path) if resource else None
        application = kwargs.get("application")
        redirect = urlsplit(kwargs.get("redirect_uri") or "")
        context.update(
            {
                "client_name": (application.name or application.client_id) if application else "",
                "client_id": application.client_id if application else "",
                "redirect_host": redirect.netloc,
                "resource_url": resource,
                "resource_description": MCP_RESOURCES.get(mount or "", ""),
                "memberships": _user_memberships(self.request.user),
                "scope_descriptions": [SCOPES.get(s, s) for s in kwargs.get("scopes", [])],
            }
        )
        return context

    def form_valid(self, form: ConsentForm) -> HttpResponse:
        """The user decided: allow (with a membership of theirs) or deny (an ``access_denied``
        redirect)."""
        data = form.cleaned_data
        credentials = {"redirect_uri": data.get("redirect_uri"), "state": data.get("state")}
        application = get_application_model().objects.filter(client_id=data.get("client_id") or "").first()
        if application is None:  # a tampered form (DOT would raise DoesNotExist: a 500)
            return self.error_response(OAuthToolkitError(error=errors.InvalidClientIdError()), None)
        redirect_uri = data.get("redirect_uri") or ""
        if redirect_uri_problem(redirect_uri) is not None or not application.redirect_uri_allowed(redirect_uri):
            # never redirect there
            return self.error_response(OAuthToolkitError(error=errors.MismatchingRedirectURIError()), None)
        try:
            self._check_extensions(self.request.POST, credentials)
        except OAuthToolkitError as error:
            return self.error_response(error, application)
        self._mcp_membership = form.memberships.get(data.get("membership") or 0)
        if data.get("allow") and self._mcp_membership is None:
            form.add_error("membership", "Choose the tenant this client acts in.")
            return self.form_invalid(form)
        return super().form_valid(form)

    def create_authorization_response(
        self, request: HttpRequest, scopes: str, credentials: dict[str, Any], allow: bool
    ) -> Any:
        if allow:
            credentials = {**credentials, "mcp_membership": self._mcp_membership}
        # the consent's audit event (McpOAuth2Validator.save_authorization_code) gets the address
        with audit_context(context_for_request(request, source="auth")):
            return super().create_authorization_response(request, scopes, credentials, allow)

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        """The page, with the site's CSP widened for this form only: ``form-action`` also allows
        the client's redirect URI (checked against the client's registered ones), since the
        browser applies ``form-action`` to the redirect that answers the form."""
        response = super().render_to_response(context, **kwargs)
        source = _redirect_source(context.get("application"), context.get("redirect_uri") or "")
        policy = policy_for_path(self.request.path)
        if source and "form-action 'self'" in policy:
            response[CSP_HEADER] = policy.replace("form-action 'self'", f"form-action 'self' {source}", 1)
        return response

    def form_invalid(self, form: ConsentForm) -> HttpResponse:
        data = form.data
        return self.render_to_response(
            self.get_context_data(
                form=form,
                application=get_application_model().objects.filter(client_id=data.get("client_id") or "").first(),
                resource=data.get("resource", ""),
                redirect_uri=data.get("redirect_uri", ""),
                scopes=(data.get("scope") or "").split(),
            )
        )


class ProtectedResourceMetadataView(OAuthProtectedResourceMetadataView):
    """RFC 9728 metadata of one MCP endpoint (``mount``, from the URL), at
    ``/.well-known/oauth-protected-resource/mcp/<name>/``: its identifier, this server as its
    authorization server, the scope, the header bearer method."""

    mount = ""

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        self.mount = mount_of("/" + kwargs.get("resource_path", "").strip("/")) or ""
        if not self.mount:
            return JsonResponse({"error": "not_found", "error_description": "No such protected resource."}, status=404)
        return super().get(request, *args, **kwargs)

    def get_resource(self, request: HttpRequest) -> str:
        return resource_url(self.mount, origin(request))

    def get_authorization_servers(self, request: HttpRequest) -> list[str]:
        return [origin(request)]

    def get_scopes_supported(self) -> list[str]:
        return sorted(SCOPES)

    def get_resource_name(self) -> str:
        return f"Agent Platform: {MCP_RESOURCES[self.mount].lower()}"


def root_protected_resource_metadata(request: HttpRequest) -> HttpResponse:
    """``/.well-known/oauth-protected-resource`` (no path): a JSON 404 naming the per-endpoint
    documents (``resource_metadata``).

    This server protects two resources (``/mcp/agents/``, ``/mcp/knowledge/``), each with its
    own identifier; RFC 9728 §3.1 puts a resource's document at the path-inserted URL, which an
    MCP client (2025-11-25) tries before the root one. A root document would have to name one
    resource (or the origin, which the authorization endpoint refuses as ``invalid_target``),
    and RFC 9728 §3.3 has a client reject a document whose ``resource`` is not what it dialled.
    """
    base = origin(request)
    return JsonResponse(
        {
            "error": "not_found",
            "error_description": "Each MCP endpoint has its own protected resource metadata: see resource_metadata.",
            "resource_metadata": [metadata_url(mount, base) for mount in MCP_RESOURCES],
        },
        status=404,
    )


def openid_configuration(request: HttpRequest) -> HttpResponse:
    """``/.well-known/openid-configuration``: a JSON 404 (this is an OAuth 2.1 authorization
    server, not an OpenID provider: no ID tokens); MCP clients try the RFC 8414 document,
    ``/.well-known/oauth-authorization-server``, first, and a JSON 404 lets one that tries this
    URL move on instead of failing on the chat app's HTML."""
    return JsonResponse(
        {
            "error": "not_found",
            "error_description": "Not an OpenID provider: see /.well-known/oauth-authorization-server (RFC 8414).",
        },
        status=404,
    )


class McpTokenView(TokenView):
    """DOT's token endpoint; an error raised while saving the tokens (e.g. ``invalid_target``
    when the token request names a resource the code was not granted for) comes back from DOT
    as a JSON body labelled ``text/html``: labelled ``application/json`` here, as RFC 6749
    §5.2 wants."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().post(request, *args, **kwargs)
        if (
            response.status_code >= 400
            and response.content.startswith(b"{")
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            response["Content-Type"] = "application/json"
            response["Cache-Control"] = "no-store"
        return response


class RegistrationView(DynamicClientRegistrationView):
    """RFC 7591 registration, open to anyone (``AllowAllDCRPermission``) but at most
    ``API_THROTTLE_RATES["oauth_register.ip"]`` per client address: over it, 429 with
    ``Retry-After`` and an RFC 7591-shaped error body."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        from types import SimpleNamespace

        from tenants.throttling import ClientIpThrottle

        throttle = ClientIpThrottle()
        if not throttle.allow_request(request, SimpleNamespace(throttle_scope=REGISTER_THROTTLE_SCOPE)):  # type: ignore[arg-type]
            seconds = max(1, int(throttle.wait() or 1))
            response = JsonResponse(
                {
                    "error": "too_many_requests",
                    "error_description": f"Too many client registrations from this address: try again in {seconds} s.",
                },
                status=429,
            )
            response["Retry-After"] = str(seconds)
            return response
        return super().post(request, *args, **kwargs)
