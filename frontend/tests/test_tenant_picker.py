"""The SPA's tenant picker (issue 23, H2): a user of two tenants picks one in the header; the
app shows it and the user lands there at the next login."""

from __future__ import annotations

import pytest

from frontend.tests.test_spa import CHROMIUM, open_page  # noqa: F401  (same browser setup)
from tenants.services import membership_create

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.usefixtures("all_tenants_scope"),
]


@pytest.fixture(autouse=True)
def _needs_chromium():
    from pathlib import Path

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (scripts/ensure_chromium.sh installs it)")


def _log_in(page, live_server_url, username, *, navigate=True):
    if navigate:
        page.goto(live_server_url + "/")
    page.get_by_test_id("login-username").fill(username)
    page.get_by_test_id("login-password").fill("pw-user-123")
    page.get_by_test_id("login-submit").click()


def test_a_user_of_two_tenants_picks_one_and_lands_there_next_time(world, other_world, live_server_url):
    user = world.member
    membership_create(tenant=other_world.tenant, user=user)
    from playwright.sync_api import expect

    with open_page() as page:
        _log_in(page, live_server_url, user.username)
        picker = page.get_by_test_id("tenant-picker")
        expect(picker).to_have_value("acme")  # the oldest membership: nothing picked yet
        picker.select_option("globex")
        expect(page.get_by_test_id("tenant-picker")).to_have_value("globex")  # after the reload
        page.get_by_test_id("logout").click()
        # the app goes to its login form itself: a goto now raced that navigation (ERR_ABORTED in CI)
        expect(page.get_by_test_id("login-username")).to_be_visible()
        _log_in(page, live_server_url, user.username, navigate=False)
        expect(page.get_by_test_id("tenant-picker")).to_have_value("globex")


def test_a_user_of_one_tenant_sees_its_name(world, live_server_url):
    from playwright.sync_api import expect

    with open_page() as page:
        _log_in(page, live_server_url, world.member.username)
        expect(page.get_by_test_id("tenant-name")).to_have_text("Acme")
        expect(page.get_by_test_id("tenant-picker")).to_have_count(0)
