"""The server's settings (app/settings.py): read with the engine's from one file and one environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import HttpSettings, load_server_settings
from engine import InvalidArgument, Settings


def toml(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "segstore.toml"
    path.write_text(text)
    return {"SEGSTORE_CONFIG": str(path)}


def test_defaults_need_nothing() -> None:
    settings, http = load_server_settings({})
    assert http == HttpSettings() and http.bind == "127.0.0.1:8080" and http.bind_is_loopback
    assert settings == Settings(advertise_url="http://127.0.0.1:8080")
    # The Durable Streams clients and conformance suite wait 20 s for a long-poll.
    assert http.stream_long_poll_s == 20


def test_one_file_and_one_environment_for_both(tmp_path: Path) -> None:
    env = toml(tmp_path, "container_count = 8\nflush_threshold_ms = 5\nlog_level = 'debug'\n")
    env |= {"SEGSTORE_CONTAINER_COUNT": "2", "SEGSTORE_TAIL_WAIT_MAX_S": "0.5", "SEGSTORE_BIND": "0.0.0.0:9"}
    settings, http = load_server_settings(env)
    assert (settings.container_count, settings.flush_threshold_ms, http.log_level) == (2, 5, "debug")
    assert settings.tail_wait_max_s == 0.5 and http.bind == "0.0.0.0:9" and not http.bind_is_loopback
    assert settings.node_url == "http://0.0.0.0:9"
    assert load_server_settings(env, container_count=3, access_log=1)[0].container_count == 3
    assert load_server_settings(env, advertise_url="http://n1:9")[0].node_url == "http://n1:9"
    with pytest.raises(TypeError, match="flush_treshold_ms"):
        load_server_settings(env, flush_treshold_ms=5)


def test_a_key_neither_knows_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="acces_log"):
        load_server_settings(toml(tmp_path, "acces_log = 1\n"))
    with pytest.raises(InvalidArgument, match="access_log must be int"):
        load_server_settings(toml(tmp_path, "access_log = 'yes'\n"))


def test_port_gives_the_bind_when_nothing_names_one(tmp_path: Path) -> None:
    """Platforms that run a Procfile say where to listen in PORT, as gunicorn's own default reads it."""
    def bind(env: dict[str, str]) -> str:
        return load_server_settings(env)[1].bind

    assert bind({"PORT": "5123"}) == "0.0.0.0:5123"
    assert bind({"PORT": "5123", "SEGSTORE_BIND": "127.0.0.1:9000"}) == "127.0.0.1:9000"
    assert bind({"PORT": "5123", **toml(tmp_path, 'bind = "[::1]:7000"\n')}) == "[::1]:7000"


@pytest.mark.parametrize("port", ["", "http", "0", "65536", "-1", " 80"])
def test_a_port_that_is_not_a_port_number_is_refused(port: str) -> None:
    with pytest.raises(InvalidArgument, match="PORT"):
        load_server_settings({"PORT": port})


@pytest.mark.parametrize("name", ["sse_keepalive_s", "stream_long_poll_s", "stream_reap_interval_s"])
def test_waits_with_no_meaning_at_zero_refuse_it(name: str) -> None:
    """A keep-alive, a long-poll or the reaper spinning."""
    with pytest.raises(InvalidArgument, match=f"{name} must be more than 0"):
        HttpSettings(**{name: 0})
    with pytest.raises(InvalidArgument, match="takeover_wait_s must not be negative"):
        HttpSettings(takeover_wait_s=-1)


def test_a_live_stream_sends_keepalives_within_the_longest_tail_wait() -> None:
    """A wait longer than tail_wait_max_s is one the store refuses: the stream would end at once."""
    assert HttpSettings(sse_keepalive_s=15).sse_wait_s(Settings(tail_wait_max_s=5)) == 5
    assert HttpSettings().sse_wait_s(Settings()) == 15


@pytest.mark.parametrize("bind", ["8081", ":8081", "localhost", "127.0.0.1:", "127.0.0.1:99999", "a b:80"])
def test_a_bind_that_is_not_host_and_port_is_refused(bind: str) -> None:
    with pytest.raises(InvalidArgument, match="host:port expected"):
        load_server_settings({"SEGSTORE_BIND": bind})


@pytest.mark.parametrize("bind", ["127.0.0.1:8081", "0.0.0.0:0", "[::1]:8080", "localhost:80", "unix:/tmp/s"])
def test_binds_gunicorn_takes_are_accepted(bind: str) -> None:
    assert load_server_settings({"SEGSTORE_BIND": bind})[1].bind == bind
