"""A headless system Chromium driven by Selenium: the page tests and the README screenshots use it.

Browser downloads are not possible on our machines, so this uses Debian's ``chromium`` and
``chromium-driver`` packages (``make test`` installs them) and never lets Selenium fetch a driver.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from specdec.errors import SpecdecError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVERS = ("chromedriver", "/usr/lib/chromium/chromedriver")


def find(candidates: tuple[str, ...]) -> str | None:
    for name in candidates:
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    return None


def chromium(width: int = 1400, height: int = 1000):
    """A Selenium driver for headless Chromium that keeps the page's console log."""
    browser, driver = find(BROWSERS), find(DRIVERS)
    if browser is None or driver is None:
        raise SpecdecError("no system Chromium: install Debian's chromium and chromium-driver "
                           "(make test does: apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)
