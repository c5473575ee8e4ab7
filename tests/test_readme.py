"""The README's snippets run as written: every block marked ``<!-- runnable -->``, in order.

Every ``sh`` and ``python`` block of README.md is preceded by a marker:
``<!-- runnable -->`` (run here, from the repository root, against a fresh
server; each port the README names becomes a free one: 8080, the server's,
and those of the servers and moto some blocks start themselves, since a
machine running the suite may have them taken, by another run of the suite
too, whose blocks would then talk to its servers; and ``/tmp/`` a folder of
the test's own) or ``<!-- not run: why -->``. Shell blocks run under ``bash -e``, Python blocks under this
venv's Python; each must exit 0, and they run in the README's order, as a
reader walks it (a block may use what an earlier one made).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from bench.servers import ROOT, ServerProcess, free_port
from tests.processes import killed_at_exit

README = ROOT / "README.md"
# A fenced block and the line before it (its marker).
_BLOCK = re.compile(r"^(?P<marker>[^\n]*)\n```(?P<lang>\w+)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
RUNNABLE = "<!-- runnable -->"
NOT_RUN = re.compile(r"<!-- not run: .+ -->")
# The README's addresses, in every form it writes them: 8080 for the server (``make run``), the others
# for the servers and moto that blocks start themselves; and the port moto_server is told to use.
README_PORTS = (8080, 8081, 8082, 8090, 5000)
_README_ADDRESS = re.compile(rf"\b(localhost|127\.0\.0\.1):({'|'.join(map(str, README_PORTS))})\b")
_MOTO_PORT = re.compile(r"(moto_server\b[^\n]*? -p )(\d+)\b")
# What the README's commands must not inherit from the machine running the suite.
_NOT_PASSED = ("SEGSTORE_", "AWS_", "PYSPARK_", "VIRTUAL_ENV", "PYTHONPATH")


def blocks() -> list[tuple[str, str, str]]:
    """(marker line, language, code) of every fenced block of the README."""
    return [(m["marker"], m["lang"], m["code"]) for m in _BLOCK.finditer(README.read_text(encoding="utf-8"))]


def runnable() -> list[tuple[str, str]]:
    return [(lang, code) for marker, lang, code in blocks() if marker == RUNNABLE]


def test_every_shell_and_python_block_says_whether_it_runs() -> None:
    unmarked = [
        code.splitlines()[0]
        for marker, lang, code in blocks()
        if lang in ("sh", "python") and marker != RUNNABLE and not NOT_RUN.fullmatch(marker)
    ]
    assert unmarked == [], "README blocks with neither <!-- runnable --> nor <!-- not run: why -->"
    assert len(runnable()) >= 10


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the README's blocks write under /tmp/: another run's files there are not theirs."""
    return tmp_path_factory.mktemp("readme-tmp")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """What ``make run`` starts (one process per core), on a data folder of its own."""
    with killed_at_exit(ServerProcess(tmp_path_factory.mktemp("readme") / "data", processes=0)) as running:
        yield running


@pytest.fixture(scope="module")
def ports(server: ServerProcess) -> dict[str, str]:
    """The port each of the README's ports becomes: the server's for 8080, a free one for the others."""
    return {str(port): str(server.port if port == 8080 else free_port()) for port in README_PORTS}


def _environment(server: ServerProcess) -> dict[str, str]:
    """The machine's environment less what the README must not inherit; the CLI pointed at ``server``."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_PASSED)}
    return kept | {"SEGSTORE_ENDPOINT": server.url}


# The blocks this process ran so far, in order, each with its server's port: a failure names them.
_RAN: list[str] = []


def _scopes_and_streams(server: ServerProcess) -> str:
    """What the server holds of scopes and streams, for a failure's message."""
    try:
        scopes = requests.get(f"{server.url}/v1/scopes", timeout=5).json()["scopes"]
        streams = {s: requests.get(f"{server.url}/v1/scopes/{s}/streams", timeout=5).json() for s in scopes}
    except (requests.RequestException, ValueError, KeyError) as err:
        return f"(not read: {err!r})"
    return repr(streams)


def _id(block: tuple[str, str]) -> str:
    return f"{block[0]}: {block[1].strip().splitlines()[0][:60]}"


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable(), ids=_id)
def test_a_runnable_block_runs_as_written(
    server: ServerProcess, ports: dict[str, str], scratch: Path, block: tuple[str, str]
) -> None:
    lang, code = block
    code = _README_ADDRESS.sub(lambda m: f"{m[1]}:{ports[m[2]]}", code).replace("/tmp/", f"{scratch}/")
    code = _MOTO_PORT.sub(lambda m: f"{m[1]}{ports[m[2]]}", code)
    command = ["bash", "-e", "-o", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    environment = _environment(server)
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n"
        f"the server's log:\n{server.log_tail(30)}\n"
        f"blocks run before (server port): {_RAN}\n"
        f"the server's scopes and streams: {_scopes_and_streams(server)}"
    )
    _RAN.append(f"{_id(block)} ({server.port})")
    assert server.proc is not None and server.proc.poll() is None, "the server died"
