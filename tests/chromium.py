"""Debian Chromium for the end-to-end tests, driven by Playwright (PyPI), with the network shut.

Never run ``playwright install`` here: it downloads a browser. We launch /usr/bin/chromium.
Without it a browser test is skipped with a message, except under CI, where it fails: CI must
install Chromium (``.ci/run`` does).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps trying hosts it cannot reach.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    """Skip (or, under CI, fail) when Debian Chromium is missing."""
    if CHROMIUM.exists():
        return
    msg = f"browser tests need Debian Chromium at {CHROMIUM} (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


_shared: list = []  # [playwright, browser] once started: one per test process


def shared_browser() -> Any:
    """The test process's one headless Chromium (Playwright's sync API allows one driver per
    thread: a second `sync_playwright()` while the first runs fails)."""
    require_chromium()
    if not _shared:
        from playwright.sync_api import sync_playwright

        pw = sync_playwright().start()
        _shared[:] = [pw, pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)]
    return _shared[1]


def stop_shared_browser() -> None:
    if _shared:
        pw, b = _shared
        _shared.clear()
        b.close()
        pw.stop()


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium; the caller makes contexts (and closes them) and pages."""
    yield shared_browser()


def collect_errors(page: Any, errors: list[str], ignore: Callable[[str], bool] = lambda text: False) -> None:
    """Record uncaught page errors and console errors (minus those ``ignore`` accepts)."""

    def on_console(msg: Any) -> None:
        if msg.type == "error" and not ignore(msg.text):
            errors.append(f"console.error: {msg.text}")

    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", on_console)


SCREENSHOTS = os.environ.get("JPM_SCREENSHOTS", "") not in ("", "0")


def screenshot(target: Any, path: Path, **options: Any) -> None:
    """A picture for a person to look at, in test-artifacts/, taken only when JPM_SCREENSHOTS=1: no
    test reads them, and the ~300 of a whole run took Chromium about 0.3 s each on 2 cores. Without
    it, a Locator is still waited on until it is visible, as its screenshot would have been. (Pictures
    of a failure are taken always, where the test fails.)"""
    if SCREENSHOTS:
        target.screenshot(path=str(path), **options)
    elif hasattr(target, "wait_for"):  # a Locator; a Page has nothing to wait for
        target.wait_for(state="visible")


def artifacts_dir() -> Path:
    """test-artifacts/ at the repository root (git ignores it): screenshots to look at
    (JPM_SCREENSHOTS=1), and those of failures."""
    out = Path(__file__).resolve().parents[1] / "test-artifacts"
    out.mkdir(exist_ok=True)
    return out
