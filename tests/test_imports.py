"""Every module imports on its own, and every package says what it makes public.

As aiohttp's ``tests/test_circular_imports.py`` does: each module of ``exporter`` and
``bridge`` is imported in a fresh interpreter with warnings as errors, so an import circle
that only works in one order, or a module that leans on another having been imported
first, fails here instead of in a user's ``python -m`` command. ``__main__`` modules run
a command when imported and are left out.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("exporter", "bridge")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
    return names


def _packages() -> list[str]:
    return [name for name in _modules() if (REPO / name.replace(".", "/") / "__init__.py").exists()]


MODULES = _modules()


def test_the_tree_has_modules_to_check():
    assert len(MODULES) > 50 and "exporter.app.cli" in MODULES and "bridge" in MODULES


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module):
    result = subprocess.run([sys.executable, "-W", "error", "-c", f"import {module}"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"import {module} failed alone:\n{result.stderr[-2000:]}"


@pytest.mark.parametrize("package", _packages())
def test_package_declares_its_public_names(package):
    mod = importlib.import_module(package)
    public = getattr(mod, "__all__", None)
    assert isinstance(public, (list, tuple)), f"{package}/__init__.py declares no __all__"
    assert len(set(public)) == len(public), f"{package}.__all__ names something twice"
    missing = [name for name in public if not hasattr(mod, name)]
    assert not missing, f"{package}.__all__ names what the package does not have: {missing}"
