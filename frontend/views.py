"""Serves the chat SPA (static files under frontend/static/frontend/)."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie


@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    return render(request, "frontend/index.html", {"config_json": {"api_base": "/api/v1", "ws_base": "/ws"}})
