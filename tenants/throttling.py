"""API throttles per user and per tenant, on Django's cache (Redis).

A view names the budgets its writes spend in ``throttle_scopes`` (e.g. ``("messages",
"runs")``); :class:`tenants.api.mixins.TenantContextMixin` then checks, for each scope, one
:class:`UserScopedThrottle` (keyed by the user id) and one :class:`TenantScopedThrottle`
(keyed by the request's tenant id) on unsafe methods (POST, PUT, PATCH, DELETE). Rates come
from ``settings.API_THROTTLE_RATES["<scope>.<user|tenant>"]`` (``"30/minute"``; empty or
missing: no limit), read per request. A throttled request raises DRF's ``Throttled``, which
the API's exception handler answers with 429, ``Retry-After`` and the ``{message, extra}``
body. The counting is DRF's ``SimpleRateThrottle`` (a sliding window of request times), with a
request's counters read in one cache call and written in one (:func:`throttles_check`, which
the mixin's ``check_throttles`` and :func:`throttle_wait` use).

:class:`ClientIpThrottle` is the same per client address, for the login endpoint.
:func:`failures_wait` and :func:`failure_record` count only failures per client address (the
knowledge MCP server's failed token checks, ``mcp_auth.ip``): a client over its budget is
refused before its credential is looked at.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle


class _ScopedThrottle(SimpleRateThrottle):
    kind = ""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)

    def get_rate(self) -> str | None:
        """The rate for ``<scope>.<kind>`` from ``API_THROTTLE_RATES``, or None (no limit)."""
        return (getattr(settings, "API_THROTTLE_RATES", {}) or {}).get(f"{self.scope}.{self.kind}") or None

    def _ident(self, request: Request) -> Any:
        raise NotImplementedError

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        ident = self._ident(request)
        if ident is None:
            return None
        return f"throttle_{self.scope}_{self.kind}_{ident}"


class UserScopedThrottle(_ScopedThrottle):
    """One budget per user (whatever tenant or token they use)."""

    kind = "user"

    def _ident(self, request: Request) -> Any:
        user = getattr(request, "user", None)
        return user.pk if user is not None and user.is_authenticated else None


class TenantScopedThrottle(_ScopedThrottle):
    """One budget per tenant (all its users together)."""

    kind = "tenant"

    def _ident(self, request: Request) -> Any:
        tenant = getattr(request, "tenant", None)
        return tenant.pk if tenant is not None else None


class ClientIpThrottle(_ScopedThrottle):
    """One budget per client address (``REMOTE_ADDR``), for unauthenticated endpoints: the view
    sets ``throttle_scope``; the rate is ``API_THROTTLE_RATES["<scope>.ip"]``."""

    kind = "ip"

    def __init__(self) -> None:  # DRF makes throttle_classes without arguments
        pass

    def allow_request(self, request: Request, view: Any) -> bool:
        _ScopedThrottle.__init__(self, getattr(view, "throttle_scope", "") or "")
        return super().allow_request(request, view)

    def _ident(self, request: Request) -> Any:
        return request.META.get("REMOTE_ADDR") or None


def throttles_for(scopes: tuple[str, ...] | list[str]) -> list[_ScopedThrottle]:
    """A user and a tenant throttle for each scope."""
    return [cls(scope) for scope in scopes for cls in (UserScopedThrottle, TenantScopedThrottle)]


def throttles_check(throttles: list[Any], request: Any, view: Any) -> list[float | None]:
    """Spend one request of every throttle in ``throttles`` and return the waits of those that
    refuse it (empty: allowed), as DRF's ``APIView.check_throttles`` would, with the scoped
    throttles' counters read in one cache call and written in one per window length.

    DRF's loop reads and writes each throttle's history on its own: 8 round trips to Redis for
    a message POST (``messages`` and ``runs``, per user and per tenant). Here the
    :class:`UserScopedThrottle` and :class:`TenantScopedThrottle` of the list share one
    ``get_many`` and one ``set_many`` per window length (one ``MGET`` and one pipelined write
    with Django's Redis cache); any other throttle is asked on its own. The rules are DRF's
    ``SimpleRateThrottle``: a throttle over its rate refuses and records nothing, the others
    record the request even when one refuses, and a refusal's wait is ``throttle.wait()`` (None
    when the rate changed under the history). Like DRF, the counters are read, then written:
    two requests at the same instant may both pass the last free slot.
    """
    waits: list[float | None] = []
    batched: list[_ScopedThrottle] = []
    for throttle in throttles:
        if isinstance(throttle, (UserScopedThrottle, TenantScopedThrottle)):
            if throttle.rate is not None and (key := throttle.get_cache_key(request, view)) is not None:
                throttle.key = key
                batched.append(throttle)
        elif not throttle.allow_request(request, view):
            waits.append(throttle.wait())
    if not batched:
        return waits
    cache = batched[0].cache
    stored = cache.get_many(list(dict.fromkeys(t.key for t in batched)))
    histories: dict[str, list[float]] = {}  # a key two throttles share is counted as DRF would, twice
    writes: dict[int, dict[str, list[float]]] = {}
    now = batched[0].timer()
    for throttle in batched:
        history = histories.get(throttle.key)
        if history is None:
            history = histories[throttle.key] = list(stored.get(throttle.key, []))
        throttle.history, throttle.now = history, now
        while history and history[-1] <= now - throttle.duration:
            history.pop()
        if len(history) >= throttle.num_requests:
            waits.append(throttle.wait())
        else:
            history.insert(0, now)
            writes.setdefault(throttle.duration, {})[throttle.key] = history
    for duration, values in writes.items():
        cache.set_many(values, duration)
    return waits


def throttle_wait(*, scopes: tuple[str, ...] | list[str], user_id: int, tenant_id: int) -> float | None:
    """Spend one request of each scope's user and tenant budget, for entry points that are not
    DRF views (the knowledge MCP server): the same budgets and counters as a view's
    ``throttle_scopes``.

    Returns:
        None when the request is allowed (it is then counted), else the seconds to wait before
        the tightest refusing budget has room again (DRF's ``wait()``; at least 1).
    """
    from types import SimpleNamespace

    request = SimpleNamespace(user=SimpleNamespace(pk=user_id, is_authenticated=True),
                              tenant=SimpleNamespace(pk=tenant_id))
    waits = throttles_check(throttles_for(scopes), request, None)
    return max(wait or 1.0 for wait in waits) if waits else None


class _FailureThrottle(_ScopedThrottle):
    """Failures per client address: ``API_THROTTLE_RATES["<scope>.ip"]`` (only failures are
    counted, unlike :class:`ClientIpThrottle`, which counts every request)."""

    kind = "ip"

    def _ident(self, request: Any) -> Any:
        return request.META.get("REMOTE_ADDR") or None

    def load(self, address: str) -> bool:
        """Read ``address``'s failures inside the window; False when there is no limit (no rate,
        no address)."""
        from types import SimpleNamespace

        if self.rate is None:
            return False
        self.key = self.get_cache_key(SimpleNamespace(META={"REMOTE_ADDR": address}), None)  # type: ignore[arg-type]
        if self.key is None:
            return False
        self.history = self.cache.get(self.key, [])
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()
        return True


def failures_wait(*, scope: str, address: str) -> float | None:
    """Whether client ``address`` may try again, under ``API_THROTTLE_RATES["<scope>.ip"]``
    failures per window (e.g. ``"30/minute"``; empty or missing: no limit). Spends nothing: a
    failure is counted by :func:`failure_record`. For entry points that are not DRF views (the
    knowledge MCP server's token check); the counters are DRF's (Django's cache).

    Returns:
        None when ``address`` may try, else the seconds until its oldest failure in the window
        expires (at least 1).
    """
    throttle = _FailureThrottle(scope)
    if not throttle.load(address) or len(throttle.history) < throttle.num_requests:
        return None
    return throttle.wait() or 1.0


def failure_record(*, scope: str, address: str) -> None:
    """Count one failure of client ``address`` in ``<scope>.ip`` (see :func:`failures_wait`)."""
    throttle = _FailureThrottle(scope)
    if throttle.load(address):
        throttle.throttle_success()  # DRF's name for "record this request"
