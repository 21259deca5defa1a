"""Security headers and TLS settings (issue 23, L2): a Content-Security-Policy on every page,
the other security headers, and secure cookies, HSTS and the HTTPS redirect settable from the
environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.test import Client, override_settings

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
_TLS_NAMES = ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS",
              "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SECURE_PROXY_SSL_HEADER",
              "CONTENT_SECURITY_POLICY")


def _directives(policy: str) -> dict[str, list[str]]:
    result = {}
    for part in policy.split(";"):
        words = part.split()
        if words:
            result[words[0]] = words[1:]
    return result


def _assert_strict(policy: str) -> None:
    d = _directives(policy)
    assert d["default-src"] == ["'self'"]
    assert d["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval', no other origin
    assert d["style-src"] == ["'self'"]
    assert d["object-src"] == ["'none'"] and d["frame-ancestors"] == ["'none'"] and d["base-uri"] == ["'self'"]
    assert d["form-action"] == ["'self'"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/", "/admin/login/"])
def test_html_pages_carry_a_strict_content_security_policy(path):
    response = Client().get(path)
    assert response.status_code == 200
    assert "text/html" in response["Content-Type"]
    _assert_strict(response["Content-Security-Policy"])


@pytest.mark.django_db
def test_api_errors_and_json_carry_it_too():
    response = Client().get("/api/v1/agents/")
    assert response.status_code in (401, 403)
    _assert_strict(response["Content-Security-Policy"])


def test_static_files_are_served_with_debug_off_and_carry_the_policy():
    assert settings.DEBUG is False
    response = Client().get("/static/frontend/app.js")
    assert response.status_code == 200
    assert b"".join(response.streaming_content if response.streaming else [response.content])
    _assert_strict(response["Content-Security-Policy"])


@pytest.mark.django_db
def test_swagger_ui_alone_gets_the_relaxed_policy(world):
    client = Client()
    client.force_login(world.admin)
    response = client.get("/api/docs/")
    assert response.status_code == 200
    d = _directives(response["Content-Security-Policy"])
    assert d["script-src"] == ["'self'"]  # its start-up script is a file of its own (?script)
    assert "'unsafe-inline'" in d["style-src"] and d["frame-ancestors"] == ["'none'"] and d["object-src"] == ["'none'"]
    assert "<script>" not in response.content.decode()
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")
    _assert_strict(client.get("/api/schema/")["Content-Security-Policy"])


@pytest.mark.django_db
def test_the_other_security_headers():
    response = Client().get("/")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
    assert "Strict-Transport-Security" not in response  # off unless the deployment turns it on


def _tls_settings_in_a_child(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in _TLS_NAMES}
    full = {**base, "DJANGO_SETTINGS_MODULE": "agent_platform.settings", "SECRETS_FILE": "",
            "SECRET_KEY": "a-key-for-this-test-only-" + "x" * 40, "ENCRYPTION_KEY": Fernet.generate_key().decode(), **env}
    probe = ("import json; from django.conf import settings as s; print(json.dumps([s.SESSION_COOKIE_SECURE, "
             "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
             "s.SECURE_HSTS_PRELOAD, s.SECURE_PROXY_SSL_HEADER, s.CONTENT_SECURITY_POLICY]))")
    return subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)


def test_tls_settings_come_from_the_environment():
    out = _tls_settings_in_a_child({})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1])[:7] == [False, False, False, 0, False, False, None]
    out = _tls_settings_in_a_child({
        "SESSION_COOKIE_SECURE": "1", "CSRF_COOKIE_SECURE": "1", "SECURE_SSL_REDIRECT": "1",
        "SECURE_HSTS_SECONDS": "31536000", "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1", "SECURE_HSTS_PRELOAD": "1",
        "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https", "CONTENT_SECURITY_POLICY": "default-src 'none'",
    })
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [
        True, True, True, 31536000, True, True, ["HTTP_X_FORWARDED_PROTO", "https"], "default-src 'none'"]


@pytest.mark.parametrize("env, message", [
    ({"SECURE_HSTS_SECONDS": "a year"}, "SECURE_HSTS_SECONDS must be an integer"),
    ({"SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}, "SECURE_PROXY_SSL_HEADER must look like"),
])
def test_bad_tls_settings_are_refused_at_start(env, message):
    out = _tls_settings_in_a_child(env)
    assert out.returncode != 0 and message in out.stderr


TLS = dict(SESSION_COOKIE_SECURE=True, CSRF_COOKIE_SECURE=True, SECURE_SSL_REDIRECT=True, SECURE_HSTS_SECONDS=31536000,
           SECURE_HSTS_INCLUDE_SUBDOMAINS=True, SECURE_HSTS_PRELOAD=True)


@pytest.mark.django_db
def test_behind_tls_plain_http_is_redirected_and_https_gets_hsts_and_secure_cookies(world):
    with override_settings(**TLS):
        client = Client()
        response = client.get("/")
        assert response.status_code == 301 and response["Location"] == "https://testserver/"
        response = client.get("/", secure=True)
        assert response.status_code == 200
        assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
        assert response.cookies["csrftoken"]["secure"] is True
        response = client.post("/admin/login/?next=/admin/", {"username": world.admin.username, "password": "pw-admin-123"},
                               secure=True)
        assert response.status_code == 302, response.content[:500]
        assert response.cookies["sessionid"]["secure"] is True and response.cookies["sessionid"]["httponly"] is True


@pytest.mark.django_db
def test_the_proxy_header_counts_only_when_configured():
    forwarded = {"HTTP_X_FORWARDED_PROTO": "https"}
    with override_settings(SECURE_SSL_REDIRECT=True):
        assert Client().get("/", **forwarded).status_code == 301  # a client cannot claim HTTPS
    with override_settings(SECURE_SSL_REDIRECT=True, SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https")):
        assert Client().get("/", **forwarded).status_code == 200
        assert Client().get("/").status_code == 301


def test_the_documented_tls_settings_pass_djangos_deployment_checks():
    """README's TLS recipe leaves ``manage.py check --deploy`` with no security warning (DEBUG
    off, a per-install key, secure cookies, HTTPS redirect, HSTS)."""
    base = {k: v for k, v in os.environ.items() if k not in _TLS_NAMES}
    env = {**base, "DJANGO_SETTINGS_MODULE": "agent_platform.settings", "SECRETS_FILE": "",
           "SECRET_KEY": "a-key-for-this-test-only-" + "x" * 40, "ENCRYPTION_KEY": Fernet.generate_key().decode(),
           "SESSION_COOKIE_SECURE": "1", "CSRF_COOKIE_SECURE": "1", "SECURE_SSL_REDIRECT": "1",
           "SECURE_HSTS_SECONDS": "31536000", "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1", "SECURE_HSTS_PRELOAD": "1"}
    out = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=180)
    report = out.stdout + out.stderr
    assert "security.W" not in report and "security.E" not in report, report[-3000:]
    without = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, capture_output=True,
                             text=True, timeout=180, env={k: v for k, v in env.items() if k not in _TLS_NAMES})
    assert "security.W008" in without.stdout + without.stderr  # the check does look (plain HTTP: redirect off)
