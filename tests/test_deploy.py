"""The deployment files agree with the code: the example config loads, the Procfile serves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import requests
from packaging.requirements import Requirement

from engine import Settings, load_settings
from tests.serverproc import ROOT, free_port


def test_example_config_names_every_setting_and_loads() -> None:
    example = ROOT / "deploy" / "segstore.example.toml"
    keys = set(tomllib.loads(example.read_text()))
    assert keys == {f.name for f in fields(Settings)}
    settings = load_settings({"SEGSTORE_CONFIG": str(example)})
    assert settings == Settings(**tomllib.loads(example.read_text()))


def test_environment_overrides_the_config_file() -> None:
    example = ROOT / "deploy" / "segstore.example.toml"
    settings = load_settings({"SEGSTORE_CONFIG": str(example), "SEGSTORE_BIND": "127.0.0.1:9999"})
    assert settings.bind == "127.0.0.1:9999"


def procfile_web() -> str:
    web = re.search(r"^web: (.+)$", (ROOT / "Procfile").read_text(), re.M)
    assert web is not None
    return web.group(1).strip()


def test_procfile_and_make_run_serve_the_same_command() -> None:
    makefile = (ROOT / "Makefile").read_text()
    command = procfile_web()
    assert command.startswith("python -m gunicorn -c deploy/gunicorn.conf.py")
    assert re.search(r"^run:.*\n\t\$\(BIN\)/" + re.escape(command) + "$", makefile, re.M)


def platform_env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    """A platform's environment: PORT, a ``python`` with the package installed, no .venv/bin on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEGSTORE_") and k != "VIRTUAL_ENV"}
    return {
        **env,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PORT": str(port),
        "SEGSTORE_DATA_DIR": str(tmp_path / "data"),
        **extra,
    }


def test_procfile_serves_on_port_without_the_venv_on_path(tmp_path: Path) -> None:
    port = free_port()
    env = platform_env(tmp_path, port, SEGSTORE_ALLOW_UNAUTHENTICATED="1")
    assert str(ROOT / ".venv" / "bin") not in env["PATH"]
    proc = subprocess.Popen(
        ["/bin/sh", "-c", procfile_web()],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "the Procfile's server was not ready in 60 s"
            try:
                if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        assert requests.put(f"http://127.0.0.1:{port}/v1/segments/a/0", timeout=5).status_code == 201
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=40)[0].decode(errors="replace")
    assert f"Listening at: http://0.0.0.0:{port}" in output


def test_procfile_on_an_open_port_without_auth_refuses_to_start(tmp_path: Path) -> None:
    """PORT binds every interface, so without an auth file the server needs the explicit opt-in."""
    proc = subprocess.run(
        ["/bin/sh", "-c", procfile_web()],
        cwd=ROOT,
        env=platform_env(tmp_path, free_port()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "refusing to bind 0.0.0.0:" in proc.stderr and "SEGSTORE_ALLOW_UNAUTHENTICATED=1" in proc.stderr


def test_extras_bring_what_the_readme_runs() -> None:
    """``s3`` brings moto's server (the README's .venv/bin/moto_server), ``spark`` PySpark and
    pyarrow; ``test`` includes both; every ``make`` target the README names exists."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {extra: {Requirement(spec).name for spec in specs} for extra, specs in extras.items()}
    assert [Requirement(spec).extras for spec in extras["s3"]] == [{"server"}]
    assert names["s3"] == {"moto"}
    assert names["spark"] == {"pyspark", "pyarrow"}
    (own,) = [Requirement(spec) for spec in extras["test"] if Requirement(spec).name == "segstore"]
    assert own.extras == {"s3", "spark"}
    assert "moto_server" in {e.name for e in metadata.distribution("moto").entry_points}
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    named = set(re.findall(r"(?:`|^)make\s+([a-z0-9-]+)", readme, re.M))
    assert {"run", "test", "s3-deps", "spark-deps"} <= named
    for target in named:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"README names make {target}"
