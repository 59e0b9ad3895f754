"""End-to-end fixtures: Debian's Chromium driven by Playwright, signed in to the Airflow UI.

The browser is the system's /usr/bin/chromium (`make sysdeps` installs Debian's package);
Playwright's own browser download (`playwright install`) is never used. The flags are those
this machine needs: no sandbox as root, and no background networking, which the closed
network here would refuse at every start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
UI_TIMEOUT_MS = 30_000


@pytest.fixture
def airflow_ui(airflow_services, tmp_path):
    """A Playwright page in a fresh Chromium profile (an empty --user-data-dir), signed in to
    the Airflow UI as `admin` through its login page, as a user does."""
    if not CHROMIUM.exists():
        pytest.fail("/usr/bin/chromium missing: run `make sysdeps` (installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            context.set_default_timeout(UI_TIMEOUT_MS)
            page = context.pages[0] if context.pages else context.new_page()
            page.goto(f"{airflow_services.base_url}/")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(airflow_services.admin_password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/login" not in url)
            yield page
        finally:
            context.close()
