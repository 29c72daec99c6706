"""A real browser for the page tests: Debian's headless Chromium and its chromedriver
(`make setup` installs both), driven by Selenium. Playwright's own browser download
cannot run here; Selenium is given both paths, so it fetches nothing either."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.is_file():
            raise RuntimeError(f"{path} is missing: run `make setup` (Debian's chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # As root (CI here) Chromium's sandbox cannot start; /dev/shm is small in a VM.
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,2400")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class Shown:
    """What the rollout page showed, from its elements' data-* attributes."""

    versions: dict[int, dict[str, str]]
    analysts: dict[str, dict[str, str]]
    rollouts: list[dict[str, str]]
    audit_passed: str
    hours: dict[str, int]
    text: str


def _attrs(element: Any, *names: str) -> dict[str, str]:
    return {n: _attr(element, n) for n in names}


def _attr(element: Any, name: str) -> str:
    return str(element.get_attribute(f"data-{name}") or "")


def rollout_page(driver: webdriver.Chrome, airflow_url: str, token: str) -> Shown:
    """Open the page as a user logged in to Airflow: the UI's login sets its token as
    the `_token` cookie; a cookie needs a page of its host open first."""
    driver.get(f"{airflow_url}/api/v2/monitor/health")
    driver.add_cookie({"name": "_token", "value": token, "path": "/"})
    driver.get(f"{airflow_url}/regauge/")
    found = driver.find_elements

    return Shown(
        versions={
            int(_attr(e, "version")): _attrs(e, "status", "percent", "lag")
            for e in found(By.CSS_SELECTOR, "tr.version")
        },
        analysts={
            _attr(e, "user"): _attrs(e, "version", "why")
            for e in found(By.CSS_SELECTOR, "tr.analyst")
        },
        rollouts=[
            _attrs(e, "id", "version", "state", "percent")
            for e in found(By.CSS_SELECTOR, "tr.rollout")
        ],
        audit_passed=_attr(driver.find_element(By.CSS_SELECTOR, ".audit"), "passed"),
        hours={
            _attr(e, "hour"): int(_attr(e, "count"))
            for e in found(By.CSS_SELECTOR, "svg.difference-chart rect.keys")
        },
        text=driver.find_element(By.TAG_NAME, "body").text,
    )
