"""A rendered page measured in headless Chromium, with no Python package beyond the
standard library: the page is copied to a folder of its own with a script appended that,
once the page has loaded, writes what it measured as JSON into an element; Chromium's
``--dump-dom`` prints the document and the JSON is read back from it.

Chromium comes from the system's packages (``make browser``: Debian's
``chromium-headless-shell`` or ``chromium``); where none is installed, the tests that need
it are skipped and say how to install one.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: The executables tried, in this order (Debian's packages, then Chrome's own names).
NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
#: The width of a TA's laptop window, the one every report must fit.
WIDTH = 1280
#: The element the appended script writes its JSON into.
MARK = "__measured"
#: A hang guard for one browser run (a loaded machine needs seconds, never minutes).
HANG_S = 180


def browser() -> str | None:
    """The first headless Chromium on the PATH, or None."""
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def needs_browser() -> str:
    """The browser's path, or the test skipped with what to install."""
    path = browser()
    if path is None:
        pytest.skip(
            "no headless Chromium (tried " + ", ".join(NAMES) + "): `make browser` installs "
            "Debian's chromium-headless-shell as root; without a system package manager "
            "these rendered-page checks cannot run"
        )
    return path


def _run(page: Path, *flags: str, height: int) -> str:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        proc = subprocess.run(
            [needs_browser(), "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--hide-scrollbars", "--no-first-run",
             f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}",
             "--virtual-time-budget=5000", *flags, page.as_uri()],
            capture_output=True, text=True, timeout=HANG_S, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def measure(page_html: str, script: str, *, height: int = 900) -> Any:
    """What ``script`` (the body of a JavaScript function, run once the page has loaded,
    its images decoded) returns for ``page_html`` at :data:`WIDTH` px, as Python data.
    An exception in the script fails the calling test with its message."""
    appended = (
        "<script>addEventListener('load', () => { let out; try { out = (function () {"
        f"{script}\n}})(); }} catch (e) {{ out = {{error: String(e && e.stack || e)}}; }}"
        f"const pre = document.createElement('pre'); pre.id = '{MARK}';"
        "pre.textContent = JSON.stringify(out); document.body.appendChild(pre); });</script>"
    )
    text = page_html.replace("</body>", appended + "</body>", 1)
    if appended not in text:
        text += appended
    with tempfile.TemporaryDirectory(prefix="rendered-") as folder:
        page = Path(folder) / "page.html"
        page.write_text(text)
        dom = _run(page, "--dump-dom", height=height)
    found = re.search(rf'<pre id="{MARK}">(.*?)</pre>', dom, re.S)
    assert found, "the page's measuring script wrote nothing (did the page load?)"
    data = json.loads(html.unescape(found[1]))
    assert not (isinstance(data, dict) and "error" in data), data.get("error")
    return data


def screenshot(page: Path, png: Path, *, height: int = 1600) -> Path:
    """``page`` (a file) as Chromium shows it, the top ``height`` px at :data:`WIDTH` px."""
    _run(page, f"--screenshot={png}", height=height)
    return png


#: The page's widths: the document's scroll width against the window's, and the elements
#: whose right edge lies past the window (what makes a TA scroll sideways).
WIDTHS = """
const clipped = e => { for (let p = e.parentElement; p && p !== document.body;
  p = p.parentElement) { if (getComputedStyle(p).overflowX !== 'visible') return true; }
  return false; };
const wide = [...document.body.querySelectorAll('*')]
  .filter(e => e.getBoundingClientRect().right > innerWidth + 0.5 && !clipped(e))
  .slice(0, 5).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : ''));
return {scroll: document.documentElement.scrollWidth, window: innerWidth, wide: wide};
"""


def overflow(page_html: str) -> dict[str, Any]:
    """How far ``page_html`` reaches past a :data:`WIDTH` px window, and what does."""
    return measure(page_html, WIDTHS)


def assert_fits(page_html: str) -> None:
    """Nothing on the page renders past the window's width: no horizontal scroll."""
    found = overflow(page_html)
    assert found["window"] == WIDTH, found
    assert found["scroll"] <= found["window"] and not found["wide"], found
