"""A process's own port: on the public bind's host, named by the host clients are told."""

from __future__ import annotations

import pytest

from app.private_listener import bind_private


@pytest.mark.parametrize(
    ("bind", "advertise_url", "host", "url_host"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080", "127.0.0.1", "http://127.0.0.1:"),
        ("0.0.0.0:8080", "http://10.1.2.3:8080", "0.0.0.0", "http://10.1.2.3:"),  # reached from elsewhere
        ("unix:/run/segstore.sock", "http://unix:/run/segstore.sock", "127.0.0.1", "http://127.0.0.1:"),
        ("[::1]:8080", "", "::1", "http://[::1]:"),
    ],
)
def test_a_process_listens_beside_the_public_bind(
    bind: str, advertise_url: str, host: str, url_host: str
) -> None:
    sock, url = bind_private(bind, advertise_url)
    try:
        bound_host, port = sock.getsockname()[:2]
        assert bound_host == host and port not in (0, 8080)
        assert url == f"{url_host}{port}"
    finally:
        sock.close()
