"""The deployment files agree with the code: the example config loads, the Procfile serves."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import pytest
import requests
from packaging.requirements import Requirement

from app.settings import HttpSettings, load_server_settings
from bench.servers import ROOT, free_port
from engine import Settings


def test_example_config_names_every_setting_and_loads() -> None:
    example = ROOT / "deploy" / "segstore.example.toml"
    values = tomllib.loads(example.read_text())
    engine_keys, http_keys = {f.name for f in fields(Settings)}, {f.name for f in fields(HttpSettings)}
    assert set(values) == engine_keys | http_keys and not engine_keys & http_keys
    settings, http = load_server_settings({"SEGSTORE_CONFIG": str(example)})
    assert http == HttpSettings(**{k: v for k, v in values.items() if k in http_keys})
    engine_values = {k: v for k, v in values.items() if k in engine_keys}
    assert settings == Settings(**engine_values | {"advertise_url": f"http://{http.bind}"})


def test_environment_overrides_the_config_file() -> None:
    example = ROOT / "deploy" / "segstore.example.toml"
    env = {"SEGSTORE_CONFIG": str(example), "SEGSTORE_BIND": "127.0.0.1:9999"}
    settings, http = load_server_settings(env)
    assert http.bind == "127.0.0.1:9999" and settings.node_url == "http://127.0.0.1:9999"


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


@pytest.mark.process
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
            except (requests.ConnectionError, requests.Timeout):  # not listening, or busy starting
                time.sleep(0.1)
        assert requests.put(f"http://127.0.0.1:{port}/v1/segments/a/0", timeout=5).status_code == 201
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=40)[0].decode(errors="replace")
    assert f"Listening at: http://0.0.0.0:{port}" in output


@pytest.mark.process
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


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("SEGSTORE_MAX_READ_BYTES", "0", "max_read_bytes"),
        ("SEGSTORE_CONTAINER_COUNT", "many", "container_count"),
    ],
)
@pytest.mark.process
def test_a_setting_out_of_its_range_stops_the_server_with_one_line(
    tmp_path: Path, variable: str, value: str, named: str
) -> None:
    proc = gunicorn_refusing(tmp_path, {variable: value})
    assert proc.stderr.startswith(f"segstore will not start: setting {named} ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.process
def test_gunicorn_exits_on_an_open_bind_with_auth_off(tmp_path: Path) -> None:
    proc = gunicorn_refusing(tmp_path, {"SEGSTORE_BIND": "0.0.0.0:0"})
    assert "refusing to bind 0.0.0.0:0 with auth off" in proc.stderr + proc.stdout


@pytest.mark.process
def test_gunicorn_refuses_a_port_in_use_saying_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        bind = f"127.0.0.1:{holder.getsockname()[1]}"
        proc = gunicorn_refusing(tmp_path, {"SEGSTORE_BIND": bind})
    assert f"{bind} is in use (another server? stop it, or set SEGSTORE_BIND" in proc.stderr
    assert not (tmp_path / "data").exists()  # refused before any worker opened the store


@pytest.mark.process
def test_gunicorn_refuses_a_bind_without_a_host(tmp_path: Path) -> None:
    proc = gunicorn_refusing(tmp_path, {"SEGSTORE_BIND": "8081"})
    assert "setting bind='8081': host:port expected, e.g. 127.0.0.1:8081" in proc.stderr


def gunicorn_refusing(tmp_path: Path, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """gunicorn with segstore's config and these ``SEGSTORE_*`` settings (no auth), which must not start."""
    env = {**os.environ, "SEGSTORE_DATA_DIR": str(tmp_path / "data"), **settings}
    env.pop("SEGSTORE_AUTH_FILE", None)
    env.pop("SEGSTORE_ALLOW_UNAUTHENTICATED", None)
    proc = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "app:create_app()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    return proc


def test_extras_bring_what_the_readme_runs() -> None:
    """``s3`` brings moto's server (the README's .venv/bin/moto_server), ``spark`` PySpark and
    pyarrow; ``test`` includes both; every ``make`` target the README names exists."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {extra: {Requirement(spec).name for spec in specs} for extra, specs in extras.items()}
    assert [Requirement(spec).extras for spec in extras["s3"]] == [{"server"}]
    assert names["s3"] == {"moto"}
    assert extras["spark"] == ["segstore-client[spark]>=0.1"]
    client_extras = tomllib.loads((ROOT / "clients/python/pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {Requirement(spec).name for spec in client_extras["spark"]} == {"pyspark", "pyarrow"}
    (own,) = [Requirement(spec) for spec in extras["test"] if Requirement(spec).name == "segstore"]
    assert own.extras == {"s3", "spark"}
    assert "moto_server" in {e.name for e in metadata.distribution("moto").entry_points}
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    named = set(re.findall(r"(?:`|^)make\s+([a-z0-9-]+)", readme, re.M))
    assert {"run", "test", "s3-deps", "spark-deps"} <= named
    for target in named:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"README names make {target}"


def dockerfile() -> list[tuple[str, str]]:
    """deploy/Dockerfile as (INSTRUCTION, arguments), continuation lines joined, comments left out."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in joined.splitlines()
        if line.strip()
    ]


def docker_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction, args in dockerfile():
        if instruction == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
    return env


def docker_exec_form(instruction: str) -> list[str]:
    (args,) = [args for name, args in dockerfile() if name == instruction]
    if instruction == "HEALTHCHECK":
        args = args[args.index("CMD ") + len("CMD ") :]
    return json.loads(args)


def test_dockerfile_serves_the_defaults_on_every_interface_with_data_on_a_volume() -> None:
    instructions = dockerfile()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    # The client's own distribution first: the server depends on it, and no index has it.
    runs = [args for name, args in instructions if name == "RUN"]
    assert any(args.startswith("pip install ./clients/python .") for args in runs)
    env = docker_env()
    assert env["SEGSTORE_BIND"].startswith("0.0.0.0:")
    assert "SEGSTORE_ALLOW_UNAUTHENTICATED" not in env  # an open store is the operator's choice
    (volume,) = [json.loads(args) for name, args in instructions if name == "VOLUME"]
    assert volume == [env["SEGSTORE_DATA_DIR"]]
    (user,) = [args for name, args in instructions if name == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    assert docker_exec_form("CMD") == shlex.split(procfile_web())
    assert "/healthz" in " ".join(docker_exec_form("HEALTHCHECK"))
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "data", ".git"} <= set(ignored)


@pytest.mark.process
def test_the_images_command_and_healthcheck_work_here(tmp_path: Path) -> None:
    """What the image runs, run on this machine (no Docker daemon): its CMD with its ENV serves,
    and its HEALTHCHECK command passes against it and fails once it is gone."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SEGSTORE_")},
        **docker_env(),
        "SEGSTORE_DATA_DIR": str(tmp_path / "data"),
        "SEGSTORE_BIND": f"0.0.0.0:{port}",
        "SEGSTORE_ALLOW_UNAUTHENTICATED": "1",
    }
    command = docker_exec_form("CMD")
    healthcheck = docker_exec_form("HEALTHCHECK")
    assert command[0] == healthcheck[0] == "python"
    command[0] = healthcheck[0] = sys.executable
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(healthcheck, env=env, capture_output=True, timeout=10).returncode != 0:
            assert proc.poll() is None, "the image's command exited"
            assert time.monotonic() < deadline, "the healthcheck did not pass in 60 s"
            time.sleep(0.2)
        assert requests.put(f"http://127.0.0.1:{port}/v1/segments/a/0", timeout=5).status_code == 201
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(40)
    assert subprocess.run(healthcheck, env=env, capture_output=True, timeout=10).returncode != 0


@pytest.mark.slow
@pytest.mark.process
def test_the_images_build_steps_install_a_package_that_serves(tmp_path: Path) -> None:
    """The image's build without Docker: exactly what it COPYs, installed into a fresh venv by its
    ``pip install .``, serves its CMD from its WORKDIR (nothing read from this checkout)."""
    instructions = dockerfile()
    (workdir,) = [args for name, args in instructions if name == "WORKDIR"]
    image = tmp_path / workdir.lstrip("/")
    image.mkdir(parents=True)
    for name, args in instructions:
        if name == "COPY":
            *sources, target = shlex.split(args)
            destination = image / target
            for source in sources:
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, destination, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    destination.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / source, destination / source)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    (install,) = [args.split("&&")[0] for name, args in instructions if name == "RUN"]
    subprocess.run([python, "-m", *install.split()], cwd=image, check=True, timeout=600)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SEGSTORE_", "PYTHON"))},
        **docker_env(),
        "SEGSTORE_DATA_DIR": str(tmp_path / "data"),
        "SEGSTORE_BIND": f"127.0.0.1:{port}",
    }
    command = docker_exec_form("CMD")
    command[0] = python
    proc = subprocess.Popen(command, cwd=image, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the installed package's server exited"
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the installed package did not serve in 60 s"
            time.sleep(0.2)
        assert requests.put(f"http://127.0.0.1:{port}/v1/segments/a/0", timeout=5).status_code == 201
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(40)


def systemd_unit() -> dict[str, list[tuple[str, str]]]:
    """deploy/segstore.service as section -> [(key, value)] (keys may repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in (ROOT / "deploy" / "segstore.service").read_text().splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections[current] = []
        elif line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            sections[current].append((key.strip(), value.strip()))
    return sections


@pytest.mark.process
def test_systemd_unit_has_its_state_directory_settings_file_network_and_hardening(tmp_path: Path) -> None:
    unit = systemd_unit()
    assert ("Wants", "network-online.target") in unit["Unit"]
    assert ("After", "network-online.target") in unit["Unit"]
    service = unit["Service"]
    values = dict(service)
    state = "/var/lib/" + values["StateDirectory"]
    assert ("Environment", f"SEGSTORE_DATA_DIR={state}") in service
    assert values["EnvironmentFile"].lstrip("-").startswith("/etc/segstore/")
    for key, value in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("ReadWritePaths", state),
    ]:
        assert (key, value) in service, key
    python, *args = shlex.split(values["ExecStart"])
    assert python == values["WorkingDirectory"] + "/.venv/bin/python"
    assert args == shlex.split(procfile_web())[1:]
    assert ("WantedBy", "multi-user.target") in unit["Install"]
    # systemd's own check, where systemd is installed: with the paths of this checkout, no warning.
    if shutil.which("systemd-analyze"):
        copy = tmp_path / "segstore.service"
        text = (ROOT / "deploy" / "segstore.service").read_text()
        copy.write_text(text.replace(values["WorkingDirectory"], str(ROOT)))
        verified = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
        assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr
