"""Debian's headless Chromium, offline: where it lives and the flags that keep it on this machine.

One home for both users of it: the browser test (``tests/test_browser.py``), which opens the built
site, and ``oomlab dev viewer-shots`` (:mod:`oomlab.site.viewer_shots`), which photographs PyTorch's
memory viewer. Without the background-networking flags Chromium calls Google's hosts at start;
the resolver rule makes every host but 127.0.0.1 unresolvable, so a page that asks the internet
for anything fails where it asks, and the caller can name the request.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")  # Debian's packages chromium and chromium-driver
CHROMEDRIVER = Path("/usr/bin/chromedriver")

OFFLINE_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
)


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve a folder on 127.0.0.1 on a free port from a background thread; yields the base URL.

    JavaScript goes out as ``text/javascript`` whatever the machine's MIME table says, since
    Chromium refuses an ES module served as anything else.
    """

    class Quiet(SimpleHTTPRequestHandler):
        extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".js": "text/javascript"}

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def start(profile: Path, *flags: str):
    """Chromium through selenium: :data:`OFFLINE_FLAGS` and ``flags``, a fresh profile in ``profile``, every log kept.

    The chromedriver is named, so Selenium Manager never looks for (or downloads) one. Raises
    selenium's own errors; the caller says what they mean for its user.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*OFFLINE_FLAGS, *flags):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
