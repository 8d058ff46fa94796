"""The built documentation site looked at as a user would: Debian's Chromium,
headless, opens the pages from files (file://, no server), with every host
name mapped to nowhere so that nothing outside this machine can load.

* screenshots of the home page and the quick start (the DataLoader
  migration), written to build/docs/screenshots/ to be looked at, and
  checked to hold a rendered page (a sidebar and text: many colours, not a
  blank or an error page);
* the site's own search (Sphinx's search page, JavaScript reading
  searchindex.js) finds "set_epoch" and links the pages that explain it;
* no page asks for anything outside the site (scripts, styles, fonts).

Chromium's own --headless mode (--screenshot, --dump-dom) drives it: it is
the browser's maintained interface for exactly this, with nothing between
(no WebDriver, no second package whose version must match the browser's).

Run by ``bash scripts/build-docs.sh --check`` (CI's docs stage), which sets
NPYLOAD_DOCS_HTML and NPYLOAD_DOCS_CHECK=1: then a missing browser or site
fails instead of skipping."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("NPYLOAD_DOCS_HTML", REPO / "build" / "docs" / "html")).resolve()
SHOTS = HTML.parent / "screenshots"
REQUIRED = os.environ.get("NPYLOAD_DOCS_CHECK") == "1"


def _need(ok, why):
    if not ok:
        (pytest.fail if REQUIRED else pytest.skip)(why)


@pytest.fixture(scope="module")
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    _need(exe, "Chromium is not installed: apt-get install chromium (the 'docs' profile of "
               "scripts/setup-deps.sh)")
    _need((HTML / "index.html").is_file(),
          f"{HTML}/index.html: build the site first (bash scripts/build-docs.sh)")
    return exe


def _run(exe, *args, url, timeout=120):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--user-data-dir=" + str(SHOTS / ".profile"), *args, url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr[-2000:]}"
    return out.stdout


def _screenshot(exe, page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    png = SHOTS / name
    png.unlink(missing_ok=True)
    _run(exe, "--window-size=1280,1400", f"--screenshot={png}", url=(HTML / page).as_uri())
    assert png.is_file() and png.stat().st_size > 20_000, f"{png}: no screenshot"
    from PIL import Image
    img = Image.open(png).convert("RGB")
    assert img.size == (1280, 1400)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, \
        f"{png}: {len(colours or [])} colours: a blank or unstyled page?"
    # The sidebar (left) and the text column are both drawn: neither is empty.
    for box in ((0, 0, 300, 1400), (380, 0, 1100, 1400)):
        part = img.crop(box).getcolors(maxcolors=1 << 20)
        assert part is not None and len(part) > 50, f"{png}: nothing drawn in {box}"
    return png


def _dom(exe, url):
    return _run(exe, "--virtual-time-budget=20000", "--dump-dom", url=url)


def test_home_page_renders(chromium):
    _screenshot(chromium, "index.html", "home.png")
    dom = _dom(chromium, (HTML / "index.html").as_uri())
    assert "Quick start: from DataLoader to npyload" in dom
    assert 'href="migrating.html"' in dom, "the home page links the migration guide"


def test_quick_start_page_renders(chromium):
    _screenshot(chromium, "migrating.html", "quick-start.png")
    dom = _dom(chromium, (HTML / "migrating.html").as_uri())
    assert "# After: npyload" in dom and "as_tuple" in dom


def test_search_finds_set_epoch(chromium):
    dom = _dom(chromium, (HTML / "search.html").as_uri() + "?q=set_epoch")
    m = re.search(r'<ul\b[^>]*class="search"[^>]*>(.*?)</ul>', dom, re.S)
    assert m, "the search page drew no result list (JavaScript did not run?)"
    pages = set(re.findall(r'href="([\w-]+)\.html', m.group(1)))
    assert {"concepts", "python-api", "c-api"} <= pages, pages
    # The API entries themselves come first: the method and the C function.
    assert 'href="python-api.html#npyload.Loader.set_epoch"' in m.group(1)
    assert 'href="c-api.html#c.npyload_loader_set_epoch"' in m.group(1)
    assert re.search(r"found \d+ page", dom), "no 'found N pages' summary"


def test_no_page_loads_anything_from_outside():
    _need((HTML / "index.html").is_file(), f"{HTML}: build the site first")
    bad = []
    for page in HTML.rglob("*.html"):
        for m in re.finditer(r'<(script|link|img)\b[^>]*\b(src|href)="(https?:)?//', page.read_text()):
            bad.append(f"{page.relative_to(HTML)}: {m.group(0)}")
    assert not bad, bad[:10]
