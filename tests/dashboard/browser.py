"""Headless Chromium for the dashboard tests: Debian's ``chromium`` and ``chromium-driver`` through
selenium, pointed at those binaries (nothing downloads a browser or a driver)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("ROLLOUT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ROLLOUT_CHROMEDRIVER", "/usr/bin/chromedriver")


def chromium(width: int = 1600, height: int = 1000) -> Any:
    """A headless Chromium driver, or a skip naming the missing package."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra) is not installed")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (Path(path).exists() or shutil.which(path)):
            pytest.skip(f"{path} missing: install Debian's {package} (scripts/setup.sh does)")
    os.environ["SE_OFFLINE"] = "true"  # selenium-manager must never fetch a browser or a driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def wait_until(driver: Any, what: str, check: Callable[[Any], Any], timeout_s: float = 30.0) -> Any:
    """Poll ``check(driver)`` until truthy (a bound for a page that never shows it, not a timing)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(check)
    except TimeoutException as exc:
        logs = driver.get_log("browser") if hasattr(driver, "get_log") else []
        raise AssertionError(f"the page never showed {what}; browser console: {logs}") from exc


def screenshot(driver: Any, out_dir: Path, name: str, full_page: bool = True) -> Path:
    """A PNG of the page (the whole scroll height when ``full_page``) under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    if full_page:
        width = driver.execute_script("return document.documentElement.clientWidth")
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(max(height + 40, 800), 4000))
    driver.save_screenshot(str(path))
    extra = os.environ.get("ROLLOUT_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / path.name)
    return path
