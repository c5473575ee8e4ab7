"""The deployment files agree with the code: the example config loads, Procfile matches make run."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields

from engine import Settings, load_settings
from tests.serverproc import ROOT


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


def test_procfile_and_make_run_serve_the_same_command() -> None:
    procfile = (ROOT / "Procfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    web = re.search(r"^web: (.+)$", procfile, re.M)
    assert web is not None
    command = web.group(1).strip()
    assert command.startswith("gunicorn -c deploy/gunicorn.conf.py")
    assert re.search(r"^run:.*\n\t\$\(BIN\)/" + re.escape(command) + "$", makefile, re.M)
