"""Under ASGI the middleware chain runs in the request's thread (agent_platform/middleware_chain.py):
one hand-off to a thread at the top and one back to the loop at the bottom, not two per
middleware."""

from __future__ import annotations

from asgiref.sync import AsyncToSync, SyncToAsync
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from agent_platform.middleware_chain import SyncChainEnd


def _chain(handler: ASGIHandler) -> list[object]:
    """The middleware chain of ``handler``, outermost first, adapters included."""
    links, link = [], handler._middleware_chain
    while link is not None:
        links.append(link)
        link = (getattr(link, "__wrapped__", None) or getattr(link, "get_response", None)
                or getattr(link, "awaitable", None))
    return links


def test_the_asgi_chain_hands_off_once_at_each_end():
    """Before: SyncToAsync for each MiddlewareMixin's process_request and process_response,
    at run time (invisible here), because the chain above the view was async."""
    links = _chain(ASGIHandler())
    adapters = [i for i, link in enumerate(links) if isinstance(link, (SyncToAsync, AsyncToSync))]
    assert [type(links[i]).__name__ for i in adapters] == ["SyncToAsync", "AsyncToSync"]
    last = next(i for i, link in enumerate(links) if isinstance(link, SyncChainEnd))
    assert adapters == [0, last + 1], "a thread at the top, the loop again only below the last middleware"
    assert links[-1].__name__ == "_get_response_async"


def test_it_is_the_last_middleware():
    assert settings.MIDDLEWARE[-1] == "agent_platform.middleware_chain.SyncChainEnd"
