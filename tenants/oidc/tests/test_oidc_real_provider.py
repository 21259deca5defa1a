"""Single sign-on against a provider that is not our own: panva's ``oidc-provider`` (OpenID
Certified; pinned in tenants/oidc/tests/node_provider/, started with the machine's Node), with
the platform served on a real socket so that the provider can call it back.

One test follows a user through the whole life of a session as a browser and the provider
would: the login (authorization code with PKCE, the provider's own login and consent pages, the
ID token and UserInfo), the account and membership from the rules, then the user signs out *at
the provider*; the provider sends its Back-Channel Logout token to the platform, and the
platform's session is over. A second login, signed out through the platform instead, shows
RP-Initiated Logout sending the browser to the provider's end-session page.

``npm ci`` runs once, under a file lock (xdist workers may ask at once). oidc-provider 9 warns that
it wants Node 22; it runs on the machine's Node 20 for everything used here. Its guard against
server-side request forgery refuses loopback addresses, where the test's platform listens, so the
test's provider sends its back-channel requests without it (provider.mjs).
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from urllib.parse import urljoin

import pytest
import requests

from conftest import free_port
from tenants.models import Membership
from tenants.oidc.backchannel import jwks_forget
from tenants.oidc.models import OidcSession
from tenants.oidc.provider import discovery_forget

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("all_tenants_scope"),
]

PROVIDER_DIR = Path(__file__).resolve().parent / "node_provider"
CLIENT_ID, CLIENT_SECRET = "agent-platform", "a-long-client-secret-for-the-tests-0123456789"


@pytest.fixture(scope="module")
def provider_installed() -> Path:
    """oidc-provider installed from the lockfile (``npm ci``), once."""
    with open(Path(tempfile.gettempdir()) / "agent-platform-oidc-provider.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (PROVIDER_DIR / "node_modules" / "oidc-provider" / "package.json").exists():
            done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PROVIDER_DIR, capture_output=True,
                                  text=True, timeout=600)
            assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return PROVIDER_DIR / "provider.mjs"


class NodeProvider:
    """The provider's process; :attr:`lines` receives what it prints (``BACKCHANNEL ok <sid>`` …)."""

    def __init__(self, script: Path, platform: str) -> None:
        port = free_port()
        env = {**os.environ, "PORT": str(port), "CLIENT_ID": CLIENT_ID, "CLIENT_SECRET": CLIENT_SECRET,
               "PLATFORM": platform}
        self.process = subprocess.Popen(["node", str(script)], cwd=script.parent, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.issuer = self.wait_for(r"^READY (\S+)").group(1)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """The first line (from now on) matching ``pattern``; fails the test after ``timeout`` s."""
        deadline, seen = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            seen.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"the provider never printed {pattern!r}; it printed: {seen}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def node_provider(provider_installed: Path, live_server_url: str, settings) -> Iterator[NodeProvider]:
    """The provider started, and the platform's single sign-on pointed at it."""
    provider = NodeProvider(provider_installed, live_server_url)
    settings.OIDC_ENABLED = True
    settings.OIDC_ISSUER = provider.issuer
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_RP_SCOPES = "openid profile groups"
    settings.OIDC_TENANT_RULES = json.dumps([{"claim": "groups", "value": "acme-users", "tenant": "acme",
                                              "role": "member"}])
    settings.OIDC_TIMEOUT = 10.0
    discovery_forget()
    jwks_forget()
    try:
        yield provider
    finally:
        provider.stop()
        discovery_forget()
        jwks_forget()


def _form(page: requests.Response) -> tuple[str, dict[str, str]]:
    """The first form of an HTML page: its absolute action and its named inputs' values."""
    action = re.search(r'<form[^>]*action="([^"]*)"', page.text)
    assert action is not None, page.text[:2000]
    fields = dict(re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', page.text))
    return urljoin(page.url, unescape(action.group(1))), {name: unescape(value) for name, value in fields.items()}


def _sign_in(browser: requests.Session, platform: str, account: str) -> requests.Response:
    """The login as a browser does it: the platform's start, the provider's login and consent
    pages (its development interactions), back to the platform's callback."""
    page = browser.get(f"{platform}/oidc/authenticate/?next=/", timeout=30)
    for prompt, extra in (("login", {"login": account, "password": "any"}), ("consent", {})):
        action, fields = _form(page)
        assert fields.get("prompt") == prompt, (prompt, fields, page.url)
        page = browser.post(action, data={**fields, **extra}, timeout=30)
    return page


def test_a_real_provider_signs_in_and_its_back_channel_logout_ends_the_session(node_provider, world, live_server_url):
    browser = requests.Session()
    landed = _sign_in(browser, live_server_url, "dana")
    assert landed.url == f"{live_server_url}/", landed.url
    me = browser.get(f"{live_server_url}/api/v1/auth/me/", timeout=30)
    assert me.status_code == 200 and me.json()["user"]["username"] == "dana"
    assert Membership.all_tenants.get(user__username="dana").tenant.slug == "acme"
    record = OidcSession.objects.get(identity__subject="dana")
    assert record.sid  # the provider's ID token named its session

    # The user signs out at the provider (its end-session page, then "yes, sign me out").
    page = browser.get(f"{node_provider.issuer}/session/end", timeout=30)
    action, fields = _form(page)
    browser.post(action, data={**fields, "logout": "yes"}, timeout=30)
    assert node_provider.wait_for(r"^BACKCHANNEL (ok|error).*").group(0) == f"BACKCHANNEL ok {record.sid}"
    assert browser.get(f"{live_server_url}/api/v1/auth/me/", timeout=30).status_code in (401, 403)
    assert not OidcSession.objects.exists()


def test_signing_out_of_the_platform_sends_the_browser_to_the_real_providers_end_session(
        node_provider, world, live_server_url):
    browser = requests.Session()
    _sign_in(browser, live_server_url, "erin")
    csrf = browser.cookies.get("csrftoken") or browser.get(f"{live_server_url}/api/v1/auth/me/").cookies.get("csrftoken")
    answer = browser.post(f"{live_server_url}/api/v1/auth/logout/", headers={"X-CSRFToken": csrf or "",
                                                                              "Origin": live_server_url}, timeout=30)
    assert answer.status_code == 200, answer.text
    url = answer.json()["provider_logout_url"]
    assert url.startswith(f"{node_provider.issuer}/session/end?")
    # The provider accepts the platform's id_token_hint and post_logout_redirect_uri: its
    # confirmation page, whose "yes" lands back on the platform.
    page = browser.get(url, timeout=30)
    assert page.status_code == 200, page.text[:1000]
    action, fields = _form(page)
    back = browser.post(action, data={**fields, "logout": "yes"}, timeout=30)
    assert back.url == f"{live_server_url}/", back.url
    assert not OidcSession.objects.exists()
