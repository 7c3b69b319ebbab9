"""A real headless browser for the console's tests: Debian's chromium driven by selenium.

selenium is pointed at /usr/bin/chromedriver and /usr/bin/chromium explicitly
and told it is offline, so selenium-manager never tries to download a browser
or a driver. Missing chromium skips on a laptop and fails in CI, like Redis.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1360,900")


def _binary(name: str) -> str | None:
    for candidate in (f"/usr/bin/{name}", shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def start_browser(user_data_dir: Path):
    """A headless chromium WebDriver with a fresh profile in ``user_data_dir``."""
    browser, driver_path = _binary("chromium"), _binary("chromedriver")
    if not (browser and driver_path):
        if os.environ.get("CI"):
            pytest.fail("no chromium/chromedriver: scripts/test.sh installs them (ensure_chromium)")
        pytest.skip("chromium and chromedriver not installed (scripts/setup-env.sh ensure_chromium)")
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must not reach the network
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in CHROMIUM_ARGS:
        opts.add_argument(arg)
    opts.add_argument(f"--user-data-dir={user_data_dir}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(60)
    return driver


def screenshot(driver, tmp_path: Path, name: str) -> Path:
    """Save the whole page as ``tmp_path/name``; also into $KMQ_UI_SCREENSHOTS_DIR when set
    (how docs/img is refreshed: KMQ_UI_SCREENSHOTS_DIR=docs/img pytest tests/integration/test_ui.py)."""
    import base64

    # The whole page, not just the viewport (chromium's DevTools capture).
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    out = tmp_path / name
    out.write_bytes(base64.b64decode(shot["data"]))
    extra = os.environ.get("KMQ_UI_SCREENSHOTS_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(out, Path(extra) / name)
    return out


def element_text(driver, element_id: str) -> str:
    """Text of the element with ``element_id``, or "" while htmx swaps it (a stale or
    not yet present element): for use inside ``wait_until``."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.ID, element_id).text
    except (StaleElementReferenceException, NoSuchElementException):
        return ""
