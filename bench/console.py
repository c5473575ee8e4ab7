"""The console in headless Chromium: the tests' browser, a node with sample data, the README's picture.

``python -m bench.console [PATH]`` starts a node as ``make run`` does (on a
data folder and port of its own), fills it with ``fill_sample`` and saves a
screenshot of the console's overview to PATH (default ``docs/console.png``).
It needs Debian's ``chromium`` and ``chromium-driver`` (``make browser-deps``)
and Selenium (the test extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from bench.servers import ServerProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TIMEOUT_S = 10


@contextlib.contextmanager
def browser(width: int = 1360, height: int = 900) -> Iterator[Any]:
    """A headless Chromium driven by Selenium; ``driver.get_log("browser")`` gives its JavaScript console."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _ok(answer: requests.Response) -> requests.Response:
    request = answer.request
    assert answer.status_code < 300, f"{request.method} {answer.url}: {answer.status_code} {answer.text}"
    return answer


def fill_sample(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Segments, a stream scaled twice (a split, then a merge), a Durable Stream and an S3 bucket.

    Returns what it made: ``segments`` (names), ``stream`` (scope, stream),
    ``durable`` (a Durable Streams name), ``bucket`` and its ``objects``.
    """
    s = requests.Session()
    s.headers.update(headers or {})
    segments = [f"sensors/temp/{i}" for i in range(3)] + ["sensors/humidity/0", "logs/app/web-1"]
    for i, name in enumerate(segments):
        _ok(s.put(f"{url}/v1/segments/{name}", timeout=TIMEOUT_S))
        for n in range(1, 3 + i):
            body = json.dumps({"reading": n, "at": n * 10}).encode()
            frame = len(body).to_bytes(4, "big") + body
            _ok(s.post(f"{url}/v1/segments/{name}", data=frame, timeout=TIMEOUT_S))
    _ok(s.post(f"{url}/v1/segments/{segments[-1]}:seal", timeout=TIMEOUT_S))
    scope, stream = "demo", "orders"
    base = f"{url}/v1/scopes/{scope}"
    _ok(s.put(base, timeout=TIMEOUT_S))
    scaling = {"type": "events_per_s", "target": 1000, "factor": 2, "min_segments": 2}
    config = {"segments": 2, "scaling": scaling}
    _ok(s.put(f"{base}/streams/{stream}", json=config, timeout=TIMEOUT_S))
    for n in range(40):
        _ok(s.post(f"{base}/streams/{stream}/events", data=f"order {n}".encode(),
                   headers={"Routing-Key": f"customer-{n % 7}"}, timeout=TIMEOUT_S))
    split = {"seal": [0], "ranges": [[0, 0.25], [0.25, 0.5]]}
    _ok(s.post(f"{base}/streams/{stream}:scale", json=split, timeout=TIMEOUT_S))
    merge = {"seal": [2, 3], "ranges": [[0, 0.5]]}
    _ok(s.post(f"{base}/streams/{stream}:scale", json=merge, timeout=TIMEOUT_S))
    for n in range(40, 60):
        _ok(s.post(f"{base}/streams/{stream}/events", data=f"order {n}".encode(),
                   headers={"Routing-Key": f"customer-{n % 7}"}, timeout=TIMEOUT_S))
    durable = "chat/room-1"
    text = {"Content-Type": "text/plain"}
    _ok(s.put(f"{url}/v1/stream/{quote(durable)}", headers=text, timeout=TIMEOUT_S))
    _ok(s.post(f"{url}/v1/stream/{quote(durable)}", data=b"hello from a Durable Stream",
               headers={"Content-Type": "text/plain"}, timeout=TIMEOUT_S))
    bucket, objects = "photos", ["2026/cat.jpg", "2026/dog.jpg"]
    if headers is None:  # the S3 surface serves unsigned requests only without auth
        _ok(requests.put(f"{url}/{bucket}", timeout=TIMEOUT_S))
        for key in objects:
            _ok(requests.put(f"{url}/{bucket}/{key}", data=b"\xff\xd8 no JPEG", timeout=TIMEOUT_S))
    return {"segments": segments, "stream": (scope, stream), "durable": durable, "bucket": bucket,
            "objects": objects}


def wait_for_text(driver: Any, css: str, text: str, timeout_s: float = TIMEOUT_S) -> Any:
    """The element at ``css`` once its text holds ``text``; AssertionError naming what it held otherwise."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if found:
            seen = found[0].text
            if text in seen:
                return found[0]
        time.sleep(0.1)
    raise AssertionError(f"{css} did not show {text!r} within {timeout_s} s; it showed {seen[:500]!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="docs/console.png")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, ServerProcess(Path(folder) / "data") as server:
        fill_sample(server.url)
        with browser(1280, 820) as driver:
            driver.get(f"{server.url}/console/#/overview")
            wait_for_text(driver, "#containers", "running")
            events = f"{server.url}/v1/scopes/demo/streams/orders/events"
            for n in range(30):  # the live charts draw rates: half a minute of a varying load
                for _ in range(1 + (n * 7) % 11):
                    requests.post(events, data=b"x" * (200 + 40 * (n % 9)), timeout=TIMEOUT_S)
                time.sleep(1)
            driver.save_screenshot(args.path)
    print(f"saved {args.path}")


if __name__ == "__main__":
    main()
