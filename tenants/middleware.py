"""The console's tenant scope: what the database lets a console (Django admin) request see.

The console's model admins filter by the user's tenants themselves
(:mod:`tenants.admin_scoping`); this middleware makes PostgreSQL hold them to the same
(:mod:`tenants.rls`): a superuser's request runs in :func:`~tenants.scoping.system_scope`, a
staff user's in :func:`~tenants.scoping.tenants_scope` of the tenants they own or administer,
anyone else's in no scope (no tenant-owned row). It also sets the audit context (the user and
the client address, source ``console``; :mod:`tenants.audit`). Requests outside the console
pass through: API views and consumers set their own tenant scope.

A console request that meets a tenant's data key the configured ``ENCRYPTION_KEY`` does not
open (:class:`~tenants.crypto.DataKeyUnavailable`: saving a provider's key, a secret of an MCP
server) answers 503 with the operator's remedy, as the API does, instead of a server error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import escape

from tenants.audit import audit_context, context_for_request
from tenants.crypto import DataKeyUnavailable
from tenants.scoping import system_scope, tenants_scope
from tenants.selectors import admin_tenant_ids


def console_scope(user: Any) -> contextlib.AbstractContextManager[None]:
    """The scope of a console request by ``user`` (runs a query for a staff user)."""
    if not (user.is_authenticated and user.is_active and user.is_staff):
        return contextlib.nullcontext()
    if user.is_superuser:
        return system_scope()
    return tenants_scope(admin_tenant_ids(user=user))


class ConsoleScopeMiddleware:
    """Runs each console request in :func:`console_scope` of its user (after
    ``AuthenticationMiddleware``)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
        # Once, while the handler is built (this also fills the URL resolver before the web
        # process serves; agent_platform/asgi.py fills it explicitly as well).
        self._prefix: str = reverse("admin:index")

    def _is_console(self, request: HttpRequest) -> bool:
        return request.path.startswith(self._prefix)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A 503 page saying what is wrong for :class:`~tenants.crypto.DataKeyUnavailable` in
        the console; anything else goes on to Django's handling."""
        if not (isinstance(exception, DataKeyUnavailable) and self._is_console(request)):
            return None
        page = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Secrets unavailable</title>"
                f"</head><body><main><h1>This tenant's secrets cannot be opened</h1><p>{escape(exception.message)}</p>"
                "</main></body></html>")
        return HttpResponse(page, status=503)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        if not self._is_console(request):
            return self.get_response(request)
        with console_scope(request.user), audit_context(context_for_request(request, source="console")):
            return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        if not self._is_console(request):
            return await self.get_response(request)
        user = await request.auser()
        scope = await sync_to_async(console_scope)(user)
        with scope, audit_context(context_for_request(request, source="console", user=user)):
            return await self.get_response(request)
