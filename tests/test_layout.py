"""The tree stays readable: modules small enough to read whole, few modules at the engine's root.

Which package may import which is import-linter's (``pyproject.toml``); this checks the sizes.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_LINES_MAX = 500
# The console's scripts, styles and page (app/console/static) are modules of the tree too.
MODULE_PATTERNS = ("*.py", "*.js", "*.css", "*.html")
ENGINE_ROOT_MODULES_MAX = 12
PACKAGES = ("engine", "app", "clients/python/client")


def test_no_module_is_over_500_lines() -> None:
    assert all((ROOT / package).is_dir() for package in PACKAGES), "a package moved: PACKAGES follows it"
    long = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for pattern in MODULE_PATTERNS
        for path in sorted((ROOT / package).rglob(pattern))
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES_MAX
    }
    assert not long, f"split these along what they do: {long}"


def test_the_engine_root_holds_only_what_everything_uses() -> None:
    modules = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert len(modules) <= ENGINE_ROOT_MODULES_MAX, modules
