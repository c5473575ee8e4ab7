"""segstore-client installed alone into a fresh venv: none of the server's packages, and the command works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from bench.servers import ROOT, ServerProcess
from tests.processes import killed_at_exit

TOKEN = "cli-token-0123456789abcdef"
pytestmark = pytest.mark.process  # a venv, pip, and the installed command

SERVER_ONLY = ("flask", "werkzeug", "gevent", "gunicorn", "boto3", "prometheus_client", "engine", "app")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the client installed from a copy of its folder (no build files left here)."""
    root = tmp_path_factory.mktemp("client-alone")
    source = root / "source"
    shutil.copytree(ROOT / "clients" / "python", source, ignore=shutil.ignore_patterns("*.egg-info", "build"))
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)]
    subprocess.run(pip, check=True, timeout=600, cwd=root, capture_output=True)
    return root / "venv"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("client-alone-server")
    auth = root / "auth.toml"
    grants = 'grants = [{prefix = "", access = "admin"}]'
    auth.write_text(f'[[token]]\nname = "cli"\ntoken = "{TOKEN}"\n{grants}\n')
    with killed_at_exit(ServerProcess(root / "data", env={"SEGSTORE_AUTH_FILE": str(auth)})) as running:
        yield running


def _run(
    venv: Path, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``args[0]`` from the venv's bin, outside this checkout and its environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SEGSTORE_", "PYTHON", "VIRTUAL_ENV"))}
    command = [str(venv / "bin" / args[0]), *args[1:]]
    return subprocess.run(
        command, input=stdin, env={**clean, **(env or {})}, cwd=venv, capture_output=True, timeout=60
    )


@pytest.mark.slow
def test_the_client_installs_without_the_servers_packages(venv: Path) -> None:
    found = _run(venv, "python", "-c", "import importlib.util as u, sys; print([m for m in sys.argv[1:] "
                 "if u.find_spec(m)])", *SERVER_ONLY)
    assert found.stdout.decode().strip() == "[]", found.stderr
    imports = _run(venv, "python", "-c", "import client.segment_client, client.events, client.cli")
    assert imports.returncode == 0, imports.stderr
    version = _run(venv, "segstore", "--version")
    assert version.stdout.decode().strip() == f"segstore {metadata.version('segstore-client')}"


@pytest.mark.slow
def test_the_installed_command_works_against_a_server(venv: Path, server: ServerProcess) -> None:
    endpoint = {"SEGSTORE_ENDPOINT": server.url}
    health = _run(venv, "segstore", "health", env=endpoint)
    assert health.returncode == 0 and health.stdout.decode().endswith("ok\n"), health.stderr

    refused = _run(venv, "segstore", "ls", env=endpoint)
    assert refused.returncode == 1
    assert b"Unauthorized" in refused.stderr and b"--token or SEGSTORE_TOKEN" in refused.stderr

    authorized = {**endpoint, "SEGSTORE_TOKEN": TOKEN}
    data = os.urandom(100_000)
    assert _run(venv, "segstore", "put", "alone/0", stdin=data, env=authorized).returncode == 0
    assert _run(venv, "segstore", "cat", "alone/0", env=authorized).stdout == data
    wrong = _run(venv, "segstore", "--token", "not-a-known-token-at-all", "ls", env=endpoint)
    assert wrong.returncode == 1 and b"is not one the server knows" in wrong.stderr


@pytest.mark.slow
def test_shell_completion_of_the_installed_command(venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "completions"
    line = "segstore tx co"
    env = {"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}
    assert _run(venv, "segstore", env=env).returncode == 0
    assert out.read_text().split() == ["commit"]
