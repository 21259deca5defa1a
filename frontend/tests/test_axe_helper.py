"""The shared axe-core helper finds what it must (so a clean result elsewhere means something)."""

from __future__ import annotations

import pytest

from frontend.tests.axe import assert_no_serious_axe_violations, axe_violations
from frontend.tests.test_spa import CHROMIUM, open_page

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("all_tenants_scope")]


@pytest.fixture(autouse=True)
def _needs_chromium():
    from pathlib import Path

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")


def test_axe_reports_a_critical_violation_and_passes_a_clean_page():
    with open_page() as page:
        page.set_content('<html lang="en"><head><title>t</title></head><body><main>'
                         '<img src="data:,"><button></button></main></body></html>')
        ids = {v["id"] for v in axe_violations(page)}
        assert {"image-alt", "button-name"} <= ids
        with pytest.raises(AssertionError, match="image-alt"):
            assert_no_serious_axe_violations(page, label="bad page")

        page.set_content('<html lang="en"><head><title>t</title></head><body><main><h1>Hi</h1>'
                         '<img src="data:," alt="x"><button>Go</button></main></body></html>')
        assert_no_serious_axe_violations(page, label="good page")
