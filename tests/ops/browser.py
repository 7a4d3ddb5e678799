"""What the status page's browser tests share: the Debian Chromium they drive through playwright,
its flags, the check that both are there, and a page opened with its errors collected.

Needs the Debian ``chromium`` package (``/usr/bin/chromium``, or ``NVPAIR_CHROMIUM``) and the
``playwright`` Python package (its own browser download is never used). Missing either fails the
test with the install commands; it is never skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

__all__ = [
    "CHROMIUM",
    "DESKTOP",
    "FLAGS",
    "PHONE",
    "collect_errors",
    "launch",
    "opened",
    "require_browser",
]

CHROMIUM = os.environ.get("NVPAIR_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
"""An iPhone 12 to 15's CSS viewport."""


def require_browser() -> None:
    """Fail (never skip) with the install commands when Chromium or playwright is missing."""
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"Chromium at {CHROMIUM}: apt-get update && apt-get install -y chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package: pip install playwright (no `playwright install`)")
    if missing:
        pytest.fail("browser test prerequisites missing: " + "; ".join(missing), pytrace=False)


def launch(playwright: Any) -> Any:
    """The Debian Chromium, headless."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)


def collect_errors(page: Any, seen: dict[str, Any]) -> None:
    """Keep the page's uncaught errors in ``seen["errors"]`` and its console errors in
    ``seen["console"]`` (a test asserts both stay empty)."""
    seen.setdefault("errors", [])
    seen.setdefault("console", [])
    page.on("pageerror", lambda error: seen["errors"].append(str(error)))
    page.on("console", lambda m: seen["console"].append(m.text) if m.type == "error" else None)


@contextmanager
def opened(admin_url: str, seen: dict[str, Any]) -> Iterator[Any]:
    """The status page at ``admin_url`` in the Debian Chromium at desktop width, its errors
    collected in ``seen``; the browser closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport=DESKTOP)
            collect_errors(page, seen)
            page.goto(admin_url + "/")
            yield page
        finally:
            browser.close()
