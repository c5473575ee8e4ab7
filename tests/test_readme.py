"""The README's snippets run as written: every block marked ``<!-- runnable -->``, in order.

Every ``sh`` and ``python`` block of README.md is preceded by a marker:
``<!-- runnable -->`` (run here, from the repository root, against a fresh
server; the port the README names, 8080, becomes a free one, since a
machine running the suite may have 8080 taken, and ``/tmp/`` a folder of
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

from bench.servers import ROOT, ServerProcess, free_port

README = ROOT / "README.md"
# A fenced block and the line before it (its marker).
_BLOCK = re.compile(r"^(?P<marker>[^\n]*)\n```(?P<lang>\w+)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
RUNNABLE = "<!-- runnable -->"
NOT_RUN = re.compile(r"<!-- not run: .+ -->")
# The README's address of the server, in every form it writes it.
_README_ADDRESS = re.compile(r"\b(localhost|127\.0\.0\.1):8080\b")
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
    """What ``make run`` starts, on a data folder of its own."""
    with ServerProcess(tmp_path_factory.mktemp("readme") / "data", port=free_port()) as running:
        yield running


def _environment(server: ServerProcess) -> dict[str, str]:
    """The machine's environment less what the README must not inherit; the CLI pointed at ``server``."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_PASSED)}
    return kept | {"SEGSTORE_ENDPOINT": server.url}


def _id(block: tuple[str, str]) -> str:
    return f"{block[0]}: {block[1].strip().splitlines()[0][:60]}"


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable(), ids=_id)
def test_a_runnable_block_runs_as_written(
    server: ServerProcess, scratch: Path, block: tuple[str, str]
) -> None:
    lang, code = block
    code = _README_ADDRESS.sub(lambda m: f"{m[1]}:{server.port}", code).replace("/tmp/", f"{scratch}/")
    command = ["bash", "-e", "-o", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    environment = _environment(server)
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert server.proc is not None and server.proc.poll() is None, "the server died"
