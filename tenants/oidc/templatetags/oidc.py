"""``{% load oidc %}``: the single sign-on link for the login pages (the console's)."""

from django import template

from tenants.oidc.provider import oidc_login_link

register = template.Library()


@register.simple_tag
def oidc_login() -> dict[str, str] | None:
    """``{% oidc_login as sso %}``: ``{"name", "url"}`` of "Sign in with <provider>", or None (off)."""
    return oidc_login_link()
