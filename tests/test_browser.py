"""The built site in a real browser: every page served from 127.0.0.1 and opened in headless Chromium.

A page fails on a request that would leave the machine, a SEVERE console message, a broken image
or an internal link (or #fragment) that leads nowhere; search must find a word when the site is
served, and opened from disk (file://) the navigation must work and the search box must say that
search needs the site served. The checker itself is tested on small hand-made faulty pages.

Needs Debian's chromium and chromium-driver (`make test` installs them as root with apt-get),
selenium (the dev extra) and the docs extra; skipped without them. About 20 s on two idle cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from oomlab.site.chromium import CHROMEDRIVER, CHROMIUM, serve, start

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("selenium", reason="selenium is not installed: pip install -e '.[dev]'")

for _binary in (CHROMIUM, CHROMEDRIVER):
    if not _binary.is_file():
        pytest.skip(
            f"{_binary} is missing: apt-get install -y chromium chromium-driver (make test does it as root)",
            allow_module_level=True,
        )

from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.long  # tens of seconds of processes: make test starts it first

# --disable-background-networking and friends: left alone, Chromium calls Google. The resolver
# rule makes sure nothing leaves even if a page asks; the attempt is still in the log and fails.
WINDOW_FLAG = "--window-size=1280,900"  # wide enough for the sidebar and the search box
LOCAL_SCHEMES = ("data", "blob", "about")
LOAD_TIMEOUT_S = 20
SEARCH_WORD = "fragmentation"

# After the load event: wait for every image (lazy ones made eager), then list those that did not decode.
BROKEN_IMAGES_JS = """
const done = arguments[arguments.length - 1];
const images = [...document.images];
for (const img of images) if (img.loading === "lazy") img.loading = "eager";
const settled = img => img.complete ? null : new Promise(ok => {
  img.addEventListener("load", ok); img.addEventListener("error", ok); setTimeout(ok, 10000);
});
Promise.all(images.map(settled)).then(() =>
  done(images.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.getAttribute("src") || img.currentSrc)));
"""
LINKS_JS = "return [...document.querySelectorAll('a[href]')].map(a => [a.getAttribute('href'), a.href]);"


# --------------------------------------------------------------------------- serving and the browser


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start(tmp_path_factory.mktemp("chromium-profile"), WINDOW_FLAG)
    driver.set_page_load_timeout(LOAD_TIMEOUT_S)
    driver.set_script_timeout(LOAD_TIMEOUT_S)
    try:
        # Chromium starts on its own new-tab page, whose requests are none of ours: leave it, drop its logs.
        driver.get("about:blank")
        drain(driver)
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def served(built_site) -> Iterator[str]:
    with serve(built_site) as base:
        yield base


def drain(driver) -> tuple[list[dict], list[dict]]:
    """Everything logged since the last call: (Network.requestWillBeSent params, SEVERE console entries)."""
    requests = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requests.append(message["params"])
    severe = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return requests, severe


def off_machine(requests: list[dict], allowed: str) -> list[str]:
    """The URLs of requests that go anywhere but under `allowed` or to a local scheme (data:, blob:, about:)."""
    urls = [params["request"]["url"] for params in requests]
    return [url for url in urls if urlsplit(url).scheme not in LOCAL_SCHEMES and not url.startswith(allowed)]


def short(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."


# --------------------------------------------------------------------------- the checker


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value and (name == "id" or (tag == "a" and name == "name")):
                self.ids.add(value)


class Site:
    """A built site on disk and the base URL it is served at; answers where an internal link leads."""

    def __init__(self, root: Path, base: str):
        self.root = root.resolve()
        self.base = base
        self._ids: dict[Path, set[str]] = {}

    def pages(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*.html") if p.name != "404.html")

    def ids(self, page: Path) -> set[str]:
        if page not in self._ids:
            parser = _Ids()
            parser.feed(page.read_text(encoding="utf-8", errors="replace"))
            self._ids[page] = parser.ids
        return self._ids[page]

    def broken_link(self, resolved: str) -> str | None:
        """Why an internal link (absolute, as the browser resolved it) leads nowhere; None if it is fine or external."""
        parts = urlsplit(resolved)
        if parts.scheme not in ("http", "https") or parts.hostname not in ("127.0.0.1", "localhost"):
            return None  # external (or mailto: and the like): not fetched, left alone
        if not resolved.startswith(self.base + "/"):
            return "points at 127.0.0.1 outside the site"
        path = unquote(parts.path).lstrip("/")
        target = (self.root / path).resolve()
        if path.endswith("/") or target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(self.root) or not target.is_file():
            return f"no file {target.relative_to(self.root) if target.is_relative_to(self.root) else path} in the site"
        fragment = unquote(parts.fragment)
        if fragment and target.suffix == ".html" and fragment not in self.ids(target):
            return f"no id {fragment!r} in {target.relative_to(self.root).as_posix()}"
        return None


def check_page(driver, site: Site, page: str) -> list[str]:
    """Open one page of a served site and list what is wrong with it (empty when nothing is)."""
    drain(driver)  # about:blank's, since the last page was left for it
    driver.get(f"{site.base}/{page}")
    problems = [f"broken image: {src}" for src in driver.execute_async_script(BROKEN_IMAGES_JS)]
    broken = {}
    for href, resolved in driver.execute_script(LINKS_JS):
        why = site.broken_link(resolved)
        if why:
            broken[href] = why
    problems += [f"broken link: {href} ({why})" for href, why in broken.items()]
    driver.get("about:blank")  # leave the page, so that what it started after its load is logged by now
    requests, severe = drain(driver)
    problems += [f"request off the machine: {short(url)}" for url in off_machine(requests, site.base + "/")]
    problems += [f"console {entry['level']}: {entry['message']}" for entry in severe]
    return problems


def report(problems: dict[str, list[str]]) -> str:
    return "\n".join(f"{page}:\n" + "\n".join(f"    {p}" for p in found) for page, found in problems.items() if found)


# --------------------------------------------------------------------------- the course site, served


def test_every_page_is_whole_and_stays_on_the_machine(browser, built_site, served):
    site = Site(built_site, served)
    pages = site.pages()
    assert len(pages) >= 10, f"only {len(pages)} pages were built: {pages}"
    problems = {page: check_page(browser, site, page) for page in pages}
    assert not any(problems.values()), f"{sum(map(len, problems.values()))} problems in the served site:\n{report(problems)}"


def test_search_finds_a_word_when_served(browser, built_site, served):
    site = Site(built_site, served)
    browser.get(f"{served}/index.html")
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys(SEARCH_WORD)
    try:
        results = WebDriverWait(browser, 15).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "li.md-search-result__item a[href]")
        )
    except TimeoutException:
        meta = browser.find_element(By.CSS_SELECTOR, ".md-search-result__meta").text
        pytest.fail(f"searching the served site for {SEARCH_WORD!r} found nothing in 15 s (the search says {meta!r})")
    hrefs = [a.get_attribute("href") for a in results]
    assert hrefs[0].startswith(served + "/"), f"the first result for {SEARCH_WORD!r} leads off the site: {hrefs[0]}"
    assert site.broken_link(hrefs[0]) is None, f"the first result for {SEARCH_WORD!r} leads nowhere: {hrefs[0]}"
    _, severe = drain(browser)
    assert not severe, f"searching logged: {[e['message'] for e in severe]}"


# --------------------------------------------------------------------------- the course site's layout

PHONE_WIDTH = 390  # CSS pixels: a common phone held upright
# Pages with the widest tables and the recorded out-of-memory messages: each generated page kind, and the workflow's.
LAYOUT_PAGES = ("workflow.html", "measurements.html", "exercises/capstone.html", "modules/hunt.html", "allocator.html")
OVERFLOW = """
const out = {page: document.documentElement.scrollWidth, view: window.innerWidth, messages: [], tables: []};
for (const code of document.querySelectorAll('article .oomlab-message code'))
  if (code.scrollWidth > code.clientWidth + 1) out.messages.push(code.textContent.slice(0, 60));
for (const t of document.querySelectorAll('article table')) {
  const box = t.closest('.md-typeset__scrollwrap');
  const right = t.getBoundingClientRect().right;
  const wide = box ? box.scrollWidth > box.clientWidth + 1 : right > window.innerWidth + 1;
  const shadow = box ? getComputedStyle(box).backgroundImage : 'none';
  if (wide) out.tables.push([t.rows[0].textContent.trim().slice(0, 50), shadow !== 'none']);
}
return out;
"""


@contextmanager
def width(driver, css_pixels: int) -> Iterator[None]:
    """The browser as a screen ``css_pixels`` wide (a phone's, with its media queries), for the block."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": css_pixels, "height": 800, "deviceScaleFactor": 1, "mobile": True}
    )
    try:
        yield
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_an_out_of_memory_message_wraps_in_its_column_rather_than_being_cut(browser, built_site, served):
    shown = 0
    for page in LAYOUT_PAGES:
        browser.get(f"{served}/{page}")
        found = browser.execute_script(OVERFLOW)
        shown += len(browser.find_elements(By.CSS_SELECTOR, "article .oomlab-message"))
        assert not found["messages"], f"{page}: the recorded error runs past its column at 1280 px: {found['messages']}"
    assert shown, "no page shows a recorded out-of-memory message"


def test_on_a_phone_no_page_is_cut_and_a_table_too_wide_shows_that_it_scrolls(browser, built_site, served):
    with width(browser, PHONE_WIDTH):
        for page in LAYOUT_PAGES:
            browser.get(f"{served}/{page}")
            found = browser.execute_script(OVERFLOW)
            assert found["view"] == PHONE_WIDTH, f"the phone's width was not applied: {found['view']}"
            assert found["page"] <= found["view"], f"{page} scrolls sideways on a phone: {found['page']} px wide"
            assert not found["messages"], f"{page}: the recorded error runs past a phone's screen: {found['messages']}"
            silent = [header for header, shadow in found["tables"] if not shadow]
            assert not silent, f"{page}: tables wider than a phone that do not show that they scroll: {silent}"


# --------------------------------------------------------------------------- the course site, from disk


def test_site_opens_from_disk_and_says_search_needs_serving(browser, built_site):
    root = built_site.resolve()
    drain(browser)
    browser.get((root / "index.html").as_uri())
    current = urlsplit(browser.current_url).path
    links = browser.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary a.md-nav__link[href]")
    link = next((a for a in links if a.is_displayed() and urlsplit(a.get_attribute("href")).path != current), None)
    assert link is not None, "index.html opened from disk shows no navigation link to another page"
    name, target = link.text.strip(), link.get_attribute("href")
    assert target.startswith(root.as_uri() + "/"), f"the navigation link {name!r} leaves the site: {target}"
    link.click()
    WebDriverWait(browser, LOAD_TIMEOUT_S).until(
        lambda d: (
            d.current_url.split("#")[0] == target.split("#")[0] and d.execute_script("return document.readyState") == "complete"
        )
    )
    h1 = browser.find_element(By.TAG_NAME, "h1").text.strip()
    assert h1 and name in browser.title, f"clicking {name!r} opened {browser.current_url} titled {browser.title!r}, h1 {h1!r}"

    # Opened from disk, search cannot fetch its index; served-search.js shows the box disabled, saying so.
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    assert box.is_displayed(), "opened from disk, the search box is hidden instead of saying search needs the site served"
    assert not box.is_enabled(), "opened from disk, the search box takes input although search cannot work"
    placeholder = box.get_attribute("placeholder")
    assert "make serve" in placeholder, f"opened from disk, the search box says {placeholder!r}, not how to serve the site"

    # Material does not even try to start its search worker from file:// (it hides the box), so
    # nothing is allowed to fail here: no message is excused.
    requests, severe = drain(browser)
    assert not severe, f"opened from disk, the site logged: {[e['message'] for e in severe]}"
    away = off_machine(requests, root.as_uri() + "/")
    assert not away, f"opened from disk, the site requested: {[short(u) for u in away]}"


# --------------------------------------------------------------------------- the checker, on faulty pages

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<link rel="icon" href="data:,"></head><body><h1 id="top">{title}</h1>{body}</body></html>"""
PIXEL = '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'
FAULTS = {
    "clean": (
        '<img src="pixel.svg"><a href="other.html#there">ok</a> <a href="#top">top</a> <a href="https://example.com/">out</a>',
        [],
    ),
    "missing-image": ('<img src="missing.png">', ["broken image: missing.png"]),
    "broken-links": (
        '<a href="missing.html">a</a> <a href="other.html#nowhere">b</a> <a href="#gone">c</a>',
        ["broken link: missing.html", "broken link: other.html#nowhere", "broken link: #gone"],
    ),
    "external-script": (
        '<script src="https://example.com/x.js"></script>',
        ["request off the machine: https://example.com/x.js"],
    ),
    "external-fetch": (
        '<script>addEventListener("load", () => fetch("https://example.com/data.json").catch(() => {}))</script>',
        ["request off the machine: https://example.com/data.json"],
    ),
    "external-fetch-after-load": (  # while the checks run: caught when the page is left
        '<script>addEventListener("load", () => setTimeout(() => fetch("https://example.com/late.json").catch(() => {})))</script>',
        ["request off the machine: https://example.com/late.json"],
    ),
    "console-error": ('<script>console.error("deliberate failure")</script>', ["console SEVERE:", "deliberate failure"]),
    "uncaught-exception": (
        "<script>throw new Error('deliberate exception')</script>",
        ["console SEVERE:", "deliberate exception"],
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_the_checker_catches(browser, tmp_path, fault):
    body, expected = FAULTS[fault]
    (tmp_path / "pixel.svg").write_text(PIXEL, encoding="utf-8")
    (tmp_path / "other.html").write_text(PAGE.format(title="Other", body='<p id="there">there</p>'), encoding="utf-8")
    (tmp_path / "page.html").write_text(PAGE.format(title=fault, body=body), encoding="utf-8")
    with serve(tmp_path) as base:
        site = Site(tmp_path, base)
        problems = check_page(browser, site, "page.html")
    text = "\n".join(problems)
    if not expected:
        assert not problems, f"a clean page was reported:\n{text}"
    for phrase in expected:
        assert phrase in text, f"{fault}: expected {phrase!r} among the problems:\n{text or '(none)'}"
