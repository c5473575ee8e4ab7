"""The console in a real browser (headless Chromium): each page against a cluster of three with data.

What a page shows is checked against the API's own answers; each test saves
a screenshot of its page into its ``tmp_path``. Names are hostile on
purpose (markup, quotes, emoji): they must show as text, and run nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import requests
from selenium.webdriver.common.by import By

from bench.console import CHROMEDRIVER, CHROMIUM, browser, fill_sample, wait_for_text
from bench.local_cluster import LocalCluster
from bench.servers import ServerProcess
from tests.polling import wait_until
from tests.processes import killed_at_exit

pytestmark = pytest.mark.process  # Chromium and its driver are processes too
TIMEOUT_S = 10
RELOADS = 2  # of a view that does not show what it should within TIMEOUT_S (_open_showing)
SETTINGS = {
    "SEGSTORE_LEASE_S": "3",
    "SEGSTORE_CONTAINER_COUNT": "6",
    "SEGSTORE_LOG_LEVEL": "warning",
    "SEGSTORE_FLUSH_THRESHOLD_MS": "100",
}
HOSTILE = "<img src=x onerror=window.pwned=1> \"quoted\" 'single' 🦄"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("Chromium and its driver are missing: make browser-deps installs them")
    with browser() as running:
        yield running


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, s3_client: Any
            ) -> Iterator[tuple[LocalCluster, dict[str, Any]]]:
    """Three nodes sharing a bucket of moto's, their containers spread, filled with ``fill_sample``."""
    bucket = f"console-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    cluster = LocalCluster(tmp_path_factory.mktemp("console"), nodes=3, endpoint=moto_endpoint, bucket=bucket,
                           settings=SETTINGS)
    with killed_at_exit(cluster) as running:
        wait_until(lambda: running.balanced("a"), "containers spread over three nodes", 60)
        yield running, fill_sample(running.nodes["a"].url)


def _open(driver: Any, url: str, view: str) -> None:
    """Open a view; the browser's log so far (an earlier test's pages) is read and dropped first."""
    driver.get_log("browser")
    driver.get(f"{url}/console/#/{view}")


def _open_showing(driver: Any, url: str, view: str, css: str, text: str) -> Any:
    """Open a view and wait until ``css`` shows ``text``, reloading it as a user would if it does not
    within ``TIMEOUT_S``: on a loaded machine a node may lose a container's 3 s lease, and a view
    read while the container changes hands shows the problem its request met."""
    _open(driver, url, view)
    for _ in range(RELOADS):
        try:
            return wait_for_text(driver, css, text)
        except AssertionError:
            driver.get_log("browser")  # what the failed reading logged is not the reloaded page's
            driver.refresh()
    return wait_for_text(driver, css, text)


def _shot(driver: Any, tmp_path: Path, name: str) -> None:
    driver.save_screenshot(str(tmp_path / f"{name}.png"))


def _rows(driver: Any, table: str) -> list[list[str]]:
    """The table's cells, read at once in the page: a view that refreshes itself replaces its rows."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " tr => Array.from(tr.querySelectorAll('td'), td => td.innerText.trim()))",
        f"#{table} tbody tr",
    )


def _no_script_ran(driver: Any, expected: tuple[str, ...] = ("404",)) -> None:
    """No name ran or became an element; the browser logged no error but the ``expected`` statuses."""
    assert driver.execute_script("return window.pwned === undefined"), "a name ran as markup"
    assert not driver.find_elements(By.CSS_SELECTOR, "main img"), "a name became an element"
    errors = [e for e in driver.get_log("browser")
              if e["level"] == "SEVERE" and not any(status in e["message"] for status in expected)]
    assert not errors, errors


def test_the_overview_shows_each_node_and_the_owner_of_each_container(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, _ = cluster
    url = nodes.nodes["b"].url
    _open_showing(driver, url, "overview", "#nodes", "(this node)")
    answer = requests.get(f"{url}/v1/cluster", timeout=TIMEOUT_S).json()
    shown = _rows(driver, "nodes")
    assert [row[0].split()[0] for row in shown] == ["a", "b", "c"]
    assert [row[1] for row in shown] == [n["url"] for n in answer["nodes"]]

    def owners_as_the_api_says() -> bool:
        """Both read anew: a container may change hands (a lease lost under load) between two reads,
        and the page refreshes itself every two seconds."""
        answer = requests.get(f"{url}/v1/cluster", timeout=TIMEOUT_S).json()
        expected = {str(c["id"]): c["owner"] or "none" for c in answer["containers"]}
        return {row[0]: row[1] for row in _rows(driver, "containers")} == expected

    wait_until(owners_as_the_api_says, "the page shows each container's owner as the API does", 3 * TIMEOUT_S)
    wait_for_text(driver, "#overview-live", "appends")
    _shot(driver, tmp_path, "overview")
    _no_script_ran(driver)


def test_the_segment_browser_pages_through_a_prefix_as_the_api_lists_it(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, _ = cluster
    url = nodes.nodes["a"].url
    s = requests.Session()
    with ThreadPoolExecutor(8) as pool:  # a PUT on a cluster is a Tier 1 write to S3: several at once
        for answer in pool.map(lambda i: requests.put(f"{url}/v1/segments/many/s{i:03d}", timeout=TIMEOUT_S),
                               range(25)):
            answer.raise_for_status()
    s.post(f"{url}/v1/segments/many/s007", data=b"12345", timeout=TIMEOUT_S).raise_for_status()
    _open_showing(driver, url, "segments?prefix=many/&limit=10", "#segment-list", "more follow")
    first = _rows(driver, "segments")
    listed = s.get(f"{url}/v1/segments", params={"prefix": "many/", "limit": 10}, timeout=TIMEOUT_S).json()
    assert [r[0] for r in first] == [x["name"] for x in listed["segments"]]
    assert first[7][1] == "5" and first[7][4] == "open"
    _shot(driver, tmp_path, "segments")
    for _ in range(2):
        driver.find_element(By.LINK_TEXT, "next page").click()
        time.sleep(0.3)
    wait_for_text(driver, "#segment-list", "5 segments")
    assert _rows(driver, "segments")[-1][0] == "many/s024"
    assert not driver.find_elements(By.LINK_TEXT, "next page")
    _no_script_ran(driver)


def test_the_tail_follows_a_segment_and_decodes_its_frames(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, _ = cluster
    url = nodes.nodes["c"].url
    name = "tail/live"
    requests.put(f"{url}/v1/segments/{name}", timeout=TIMEOUT_S).raise_for_status()
    _open_showing(driver, url, f"segments?name={quote(name, safe='')}", "#segment-info", "open")
    driver.find_element(By.ID, "tail-toggle").click()
    wait_for_text(driver, "#tail-state", "following")
    stop = threading.Event()

    def append() -> None:
        for n in range(20):
            if stop.is_set():
                return
            body = f"event {n}: {HOSTILE}".encode()
            requests.post(f"{url}/v1/segments/{name}", data=len(body).to_bytes(4, "big") + body,
                          timeout=TIMEOUT_S).raise_for_status()
            time.sleep(0.1)

    writer = threading.Thread(target=append)
    writer.start()
    try:
        wait_for_text(driver, "#tail", "event 19:")
    finally:
        stop.set()
        writer.join()
    items = driver.find_elements(By.CSS_SELECTOR, "#tail li")
    assert len(items) == 20 and all("event" in item.text for item in items)
    assert HOSTILE in items[0].text
    _shot(driver, tmp_path, "tail")
    driver.find_element(By.ID, "tail-toggle").click()
    wait_for_text(driver, "#tail-state", "stopped")
    _no_script_ran(driver)


def test_a_scaled_stream_shows_its_epochs_as_bands_and_its_current_segments(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, made = cluster
    url = nodes.nodes["a"].url
    scope, stream = made["stream"]
    _open_showing(driver, url, f"streams?scope={scope}&stream={stream}", "#current-segments", "events")
    bands = driver.find_elements(By.CSS_SELECTOR, "#epochs g.band")
    assert sorted(int(b.get_attribute("data-segment")) for b in bands) == [0, 1, 2, 3, 4]
    base = f"{url}/v1/scopes/{scope}/streams/{stream}"
    current = requests.get(f"{base}/segments", timeout=TIMEOUT_S).json()["segments"]
    assert [r[0] for r in _rows(driver, "current-segments")] == [str(s["id"]) for s in current]
    info = _rows(driver, "stream-info")[0]
    assert info[:3] == ["active", "2", "2"] and "events_per_s" in info[3]
    _shot(driver, tmp_path, "stream")
    _open_showing(driver, url, "streams", "#scopes", stream)
    _no_script_ran(driver)


def test_buckets_durable_streams_and_reader_groups_pages(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, made = cluster
    url = nodes.nodes["b"].url
    bucket = made["bucket"]
    requests.put(f"{url}/{bucket}/{quote(HOSTILE)}", data=b"x", timeout=TIMEOUT_S).raise_for_status()
    _open_showing(driver, url, "buckets", "#buckets", bucket)
    _shot(driver, tmp_path, "buckets")
    driver.find_element(By.LINK_TEXT, bucket).click()
    wait_for_text(driver, "#objects", made["objects"][0])
    assert sorted(r[0] for r in _rows(driver, "objects")) == sorted([*made["objects"], HOSTILE])
    _no_script_ran(driver)
    driver.find_element(By.LINK_TEXT, HOSTILE).click()
    wait_for_text(driver, "#segment-name", HOSTILE)
    _shot(driver, tmp_path, "object-segment")

    durable = f"room/{HOSTILE}"
    requests.put(f"{url}/v1/stream/{quote(durable)}", headers={"Content-Type": "text/plain"},
                 data=HOSTILE.encode(), timeout=TIMEOUT_S).raise_for_status()
    tail = requests.head(f"{url}/v1/stream/{quote(durable)}", timeout=TIMEOUT_S).headers["Stream-Next-Offset"]
    _open_showing(driver, url, f"durable-streams?name={quote(durable, safe='')}", "#durable-info", tail)
    assert driver.find_element(By.ID, "durable-name").text == durable
    assert driver.find_element(By.ID, "durable-preview").text == HOSTILE
    _shot(driver, tmp_path, "durable-stream")
    _no_script_ran(driver)

    view = f"reader-groups?scope={made['stream'][0]}&group=readers"
    _open_showing(driver, url, view, "#no-reader-group", "does not exist")
    _shot(driver, tmp_path, "no-reader-group")


def _events(url: str, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        answer = requests.post(f"{url}/events", data=f"entry {i}".encode(),
                               headers={"Routing-Key": f"account-{i % 5}"}, timeout=TIMEOUT_S)
        answer.raise_for_status()


def test_the_reader_groups_page_shows_a_lagging_reader_its_positions_and_the_unassigned_segments(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, made = cluster
    url = nodes.nodes["c"].url
    scope, scaled = made["stream"]
    base = f"{url}/v1/scopes/{scope}"
    s = requests.Session()
    s.put(f"{base}/streams/ledger", json={"segments": 2}, timeout=TIMEOUT_S).raise_for_status()
    _events(f"{base}/streams/ledger", 20)
    group = f"{base}/reader-groups/billing"
    s.put(group, json={"streams": ["ledger"], "lease_s": 120}, timeout=TIMEOUT_S).raise_for_status()
    reader_url = f"{group}/readers/r-1"
    generation = s.post(f"{group}/readers", json={"reader": "r-1"}, timeout=TIMEOUT_S).json()["generation"]
    served = {"generation": generation, "max_bytes": 16, "wait": 5}  # a few events of the twenty
    fetched = s.get(f"{reader_url}/events", params=served, timeout=TIMEOUT_S).json()
    committed = {"generation": generation, "positions": fetched["positions"]}
    s.post(f"{reader_url}/positions", json=committed, timeout=TIMEOUT_S).raise_for_status()
    _events(f"{base}/streams/ledger", 10, first=20)
    answer = s.get(group, timeout=TIMEOUT_S).json()
    [reader] = answer["readers"]
    assert reader["lag_bytes"] > 0 and any(reader["segments"].values()), answer

    _open_showing(driver, url, f"reader-groups?scope={scope}&group=billing", "#readers", "r-1")
    assert _rows(driver, "readers") == [
        ["r-1", str(generation), str(len(reader["segments"])), f"{reader['lag_bytes']:,}"]]
    held = reader["segments"].items()
    assert _rows(driver, "positions") == [["r-1", segment, f"{at:,}", ""] for segment, at in held]
    assert _rows(driver, "group-info")[0][:4] == [scope, "billing", "ledger", "120 s"]
    assert not driver.find_elements(By.ID, "unassigned")
    _shot(driver, tmp_path, "reader-group")
    _no_script_ran(driver)

    idle = f"{base}/reader-groups/archive"
    s.put(idle, json={"streams": [scaled]}, timeout=TIMEOUT_S).raise_for_status()
    unassigned = s.get(idle, timeout=TIMEOUT_S).json()["unassigned"]
    _open_showing(driver, url, f"reader-groups?scope={scope}&group=archive", "#unassigned", "/")
    assert _rows(driver, "unassigned") == [[segment, f"{at:,}"] for segment, at in unassigned.items()]
    assert not driver.find_elements(By.ID, "readers")
    _no_script_ran(driver)


def test_a_hostile_reader_group_name_is_refused_and_shows_as_text(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, made = cluster
    url = nodes.nodes["a"].url
    scope, stream = made["stream"]
    refused = requests.put(f"{url}/v1/scopes/{scope}/reader-groups/{quote(HOSTILE, safe='')}",
                           json={"streams": [stream]}, timeout=TIMEOUT_S)
    assert refused.status_code == 400 and refused.json()["code"] == "InvalidName"
    view = f"reader-groups?{urlencode({'scope': scope, 'group': HOSTILE})}"
    _open_showing(driver, url, view, "main [role=alert]", "InvalidName")
    alert = driver.find_element(By.CSS_SELECTOR, "main [role=alert]").text
    assert repr(HOSTILE) in alert  # the API's detail quotes the name as Python does
    assert driver.find_element(By.NAME, "group").get_attribute("value") == HOSTILE
    _shot(driver, tmp_path, "hostile-reader-group")
    _no_script_ran(driver, expected=("400",))


def test_hostile_segment_names_show_as_text(
    cluster: tuple[LocalCluster, dict[str, Any]], driver: Any, tmp_path: Path
) -> None:
    nodes, _ = cluster
    url = nodes.nodes["a"].url
    name = f"hostile/{HOSTILE}"
    requests.put(f"{url}/v1/segments/{quote(name)}", timeout=TIMEOUT_S).raise_for_status()
    _open_showing(driver, url, "segments?prefix=hostile/", "#segments", "🦄")
    assert [r[0] for r in _rows(driver, "segments")] == [name]
    _open_showing(driver, url, f"segments?name={quote(name, safe='')}", "#segment-info", "open")
    assert driver.find_element(By.ID, "segment-name").text == name
    _shot(driver, tmp_path, "hostile")
    _no_script_ran(driver)


ADMIN = "admin-token-0123456789"
NARROW = "team-token-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One node with an auth file: an admin token, and one that reads only ``team/``."""
    folder = tmp_path_factory.mktemp("console-auth")
    auth = folder / "auth.toml"
    auth.write_text(
        f'[[token]]\nname = "admin"\ntoken = "{ADMIN}"\ngrants = [{{prefix = "", access = "admin"}}]\n'
        f'[[token]]\nname = "team"\ntoken = "{NARROW}"\ngrants = [{{prefix = "team/", access = "read"}}]\n'
    )
    with killed_at_exit(ServerProcess(folder / "data", env={"SEGSTORE_AUTH_FILE": str(auth)})) as running:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        for name in ("team/a", "team/b", "other/secret"):
            answer = requests.put(f"{running.url}/v1/segments/{name}", headers=admin, timeout=TIMEOUT_S)
            answer.raise_for_status()
        yield running


def _give_token(driver: Any, token: str) -> None:
    field = driver.find_element(By.ID, "token-input")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()


def test_with_an_auth_file_the_console_asks_for_a_token_and_shows_what_it_grants(
    server: ServerProcess, driver: Any, tmp_path: Path
) -> None:
    driver.get(f"{server.url}/console/#/overview")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    form = driver.find_element(By.ID, "token-form")
    wait_until(form.is_displayed, "the console asks for a token")
    _give_token(driver, "not-a-token-of-this-server")
    wait_for_text(driver, "#token-status", "not known")
    assert driver.execute_script("return sessionStorage.length") == 0
    _shot(driver, tmp_path, "wrong-token")
    _give_token(driver, NARROW)
    wait_for_text(driver, "#containers", "running")
    assert not driver.find_element(By.ID, "token-form").is_displayed()
    _open(driver, server.url, "segments?prefix=team/")
    wait_for_text(driver, "#segments", "team/b")
    assert [r[0] for r in _rows(driver, "segments")] == ["team/a", "team/b"]
    _shot(driver, tmp_path, "narrow-token")
    _open(driver, server.url, "segments")
    wait_for_text(driver, "#segment-list", "403")
    assert "other/secret" not in driver.find_element(By.TAG_NAME, "main").text
    _open(driver, server.url, "segments?name=other/secret")
    wait_for_text(driver, "main", "403")
    assert driver.execute_script("return sessionStorage.length") == 1
