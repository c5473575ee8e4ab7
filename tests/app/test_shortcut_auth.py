"""With an auth file, the WSGI shortcuts (native append, native read, stream append) serve
authenticated requests and answer 401 and 403 exactly as Flask's routes do: one table of
cases, each sent in the plain form a shortcut takes and in a form only Flask's view takes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.settings import HttpSettings
from engine import SegmentStore, Settings
from tests.app.test_append_shortcut import chunked_post, flask_requests
from tests.app.test_auth import ADMIN, READER, WRITER
from tests.app.test_auth import AUTH_FILE as BASE_AUTH_FILE

NARROW = "narrow-token-0123456789abcdef"
# test_auth.py's tokens, and one whose grant is a prefix of the names it writes.
AUTH_FILE = f"""{BASE_AUTH_FILE}
[[token]]
name = "narrow"
token = "{NARROW}"
grants = [{{prefix = "w/a", access = "write"}}]
"""
NAMES = ("r/seg", "w/seg", "w/ab", "w/b")
OK = "ok"  # the shortcut's own success status

# (case, Authorization header, name, answers of the native append, native read and stream append)
CASES: list[tuple[str, str | None, str, tuple[int | str, int | str, int | str]]] = [
    ("no token", None, "w/seg", (401, 401, 401)),
    ("another scheme", "Basic d3JpdGVyOnNlY3JldA==", "w/seg", (401, 401, 401)),
    ("an empty bearer token", "Bearer ", "w/seg", (401, 401, 401)),
    ("an unknown token", "Bearer not-a-known-token-at-all", "w/seg", (401, 401, 401)),
    ("no token on a missing name", None, "w/missing", (401, 401, 401)),
    ("no token on an invalid name", None, "w/../b", (401, 401, 401)),
    ("a token outside its grants", f"Bearer {READER}", "w/seg", (403, 403, 403)),
    ("a read-only token", f"Bearer {READER}", "r/seg", (403, OK, 403)),
    ("a write token in its read grant", f"Bearer {WRITER}", "r/seg", (403, OK, 403)),
    ("a write token in its write grant", f"Bearer {WRITER}", "w/seg", (OK, OK, OK)),
    ("the scheme in lower case", f"bearer {WRITER}", "w/seg", (OK, OK, OK)),
    ("a prefix grant, a name under it", f"Bearer {NARROW}", "w/ab", (OK, OK, OK)),
    ("a prefix grant, a name beside it", f"Bearer {NARROW}", "w/b", (403, 403, 403)),
    ("an admin token", f"Bearer {ADMIN}", "r/seg", (OK, OK, OK)),
    ("a granted missing name", f"Bearer {ADMIN}", "w/missing", (404, 404, 404)),
    # Stream names are not segment names: no such stream.
    ("a granted invalid name", f"Bearer {ADMIN}", "w/../b", (400, 400, 404)),
]

Send = Callable[[FlaskClient, str, dict[str, str]], Any]


@dataclass(frozen=True)
class Shortcut:
    """A shortcut's plain request (``fast``) and the same request in a form only the view takes (``slow``)."""

    url: str
    column: int  # its answers in CASES
    ok: int
    fast: Send
    slow: Send
    varying: frozenset[str]  # what differs between two successes (where each append landed)


def _native_append(client: FlaskClient, url: str, headers: dict[str, str]) -> Any:
    return client.post(url, data=b"x", headers=headers)


def _stream_append(client: FlaskClient, url: str, headers: dict[str, str]) -> Any:
    return client.post(url, data=b"x", headers={**headers, "Content-Type": "text/plain"})


def _chunked_stream_append(client: FlaskClient, url: str, headers: dict[str, str]) -> Any:
    return chunked_post(client, url, b"x", {**headers, "Content-Type": "text/plain"})


# Not one of the plain Accept values, and preferring raw bytes: Flask's view gives the same answer.
_VIEW_ACCEPT = {"Accept": "application/octet-stream, text/plain;q=0.1"}

SHORTCUTS = {
    "native append": Shortcut(
        "/v1/segments/",
        column=0,
        ok=200,
        fast=_native_append,
        slow=lambda client, url, headers: chunked_post(client, url, b"x", headers),
        varying=frozenset({"Segment-Offset", "Segment-Length", "Content-Length"}),
    ),
    "native read": Shortcut(
        "/v1/segments/",
        column=1,
        ok=200,
        fast=lambda client, url, headers: client.get(url + "?offset=0", headers=headers),
        slow=lambda client, url, headers: client.get(url + "?offset=0", headers={**headers, **_VIEW_ACCEPT}),
        varying=frozenset(),
    ),
    "stream append": Shortcut(
        "/v1/stream/",
        column=2,
        ok=204,
        fast=_stream_append,
        slow=_chunked_stream_append,
        varying=frozenset({"Stream-Next-Offset"}),
    ),
}


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Flask, FlaskClient]]:
    """One app with the auth file, its segments and streams created by the admin."""
    folder: Path = tmp_path_factory.mktemp("shortcut-auth")
    (folder / "auth.toml").write_text(AUTH_FILE)
    settings = Settings(data_dir=str(folder / "data"), container_count=2, flush_threshold_ms=50)
    app = create_app(settings, HttpSettings(auth_file=str(folder / "auth.toml")))
    store: SegmentStore = app.extensions["segstore"]
    try:
        store.wait_ready(30)
        client = app.test_client()
        admin = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "text/plain"}
        for name in NAMES:
            assert client.put("/v1/segments/" + name, headers=admin).status_code == 201
            assert client.post("/v1/segments/" + name, data=b"data", headers=admin).status_code == 200
            assert client.put("/v1/stream/" + name, headers=admin).status_code == 201
        yield app, client
    finally:
        app.extensions["streams"].close()
        store.close()


def _headers(response: Any, ignore: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    return sorted((k, v) for k, v in response.headers.items() if k not in ignore)


@pytest.mark.parametrize("kind", SHORTCUTS)
@pytest.mark.parametrize(("case", "authorization", "name", "answers"), CASES, ids=[c[0] for c in CASES])
def test_a_shortcut_answers_as_the_route_does(
    authed: tuple[Flask, FlaskClient],
    kind: str,
    case: str,
    authorization: str | None,
    name: str,
    answers: tuple[int | str, int | str, int | str],
) -> None:
    app, client = authed
    shortcut = SHORTCUTS[kind]
    url = shortcut.url + name
    headers = {} if authorization is None else {"Authorization": authorization}
    with flask_requests(app) as seen:
        fast = shortcut.fast(client, url, headers)
    assert seen == [], "the shortcut did not serve it"
    with flask_requests(app) as seen:
        slow = shortcut.slow(client, url, headers)
    assert len(seen) == 1, "the view did not serve it"
    expected = answers[shortcut.column]
    assert fast.status_code == (shortcut.ok if expected == OK else expected), fast.get_data(as_text=True)
    assert slow.status_code == fast.status_code
    if fast.status_code < 300:
        assert _headers(fast, shortcut.varying) == _headers(slow, shortcut.varying)
        assert shortcut.varying or fast.data == slow.data  # a read: the same bytes
        return
    assert fast.mimetype == "application/problem+json"
    assert fast.get_json() == slow.get_json()
    assert _headers(fast) == _headers(slow)
    refusal = {401: "Unauthorized", 403: "Forbidden"}.get(fast.status_code)
    assert refusal is None or fast.get_json()["code"] == refusal
    assert (fast.headers.get("WWW-Authenticate") == "Bearer") == (fast.status_code == 401)


def test_a_refusal_by_a_shortcut_is_counted_as_the_routes_are(authed: tuple[Flask, FlaskClient]) -> None:
    """Under the route Flask matched (no view ran to name one), whichever form the request took."""
    _, client = authed
    reader = {"Authorization": f"Bearer {READER}"}
    before = _refusals(client)
    assert _native_append(client, "/v1/segments/w/seg", reader).status_code == 403
    assert chunked_post(client, "/v1/segments/w/seg", b"x", reader).status_code == 403
    after = _refusals(client)
    grown = {series: n - before.get(series, 0.0) for series, n in after.items() if n != before.get(series)}
    assert list(grown.values()) == [2.0], grown


def _refusals(client: FlaskClient) -> dict[str, float]:
    """The request counters of 403 answers, by their labels."""
    scrape = client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    found = {}
    for row in scrape.splitlines():
        series, _, value = row.rpartition(" ")
        if series.startswith("segstore_http_requests_total{") and 'status="403"' in series:
            found[series] = float(value)
    return found
