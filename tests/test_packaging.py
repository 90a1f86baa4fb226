"""What setup.cfg installs is what the agent uses: every package of ``install_requires``
and of the runtime extras (``k8s``, ``otlp``, ``amd``, ``report``, ``journal``, ``all``) is imported
somewhere in the shipped code (exporter/, bridge/), so that no extra drags in a package
nothing uses (the ``test`` extra is the tests' own)."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUNTIME_EXTRAS = ("k8s", "otlp", "amd", "report", "journal", "all")


def _requirements() -> dict[str, set[str]]:
    """Distribution name (normalised) -> the setup.cfg sections that require it."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    sections = {"install_requires": config["options"]["install_requires"]}
    sections.update({extra: config["options.extras_require"][extra] for extra in RUNTIME_EXTRAS})
    found: dict[str, set[str]] = {}
    for section, text in sections.items():
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name = re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]
                found.setdefault(_normalise(name), set()).add(section)
    return found


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_modules() -> set[str]:
    """Every absolute module the shipped code imports (at any depth, lazily or not)."""
    modules: set[str] = set()
    for package in ("exporter", "bridge"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module)
                    modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def _provided_modules(distribution: str) -> set[str] | None:
    """The modules an installed distribution provides (None when it is not installed)."""
    try:
        files = importlib.metadata.files(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    modules = set()
    for file in files or ():
        parts = file.parts
        if file.suffix != ".py" or any(part.endswith((".dist-info", ".egg-info")) for part in parts) \
                or parts[0] in ("..", "bin"):
            continue
        dotted = list(parts[:-1]) + ([] if file.stem == "__init__" else [file.stem])
        if dotted:
            modules.add(".".join(dotted))
    return modules


def test_every_runtime_dependency_is_imported_by_the_agent() -> None:
    imported = _imported_modules()
    unused = {}
    for distribution, sections in _requirements().items():
        provided = _provided_modules(distribution)
        if provided is None:  # not installed here (amdsmi): its import name is its own
            provided = {distribution.replace("-", "_")}
        if not provided & imported:
            unused[distribution] = sorted(sections)
    assert unused == {}, f"setup.cfg installs packages the agent never imports: {unused}"


def test_the_requirements_are_read() -> None:
    requirements = _requirements()
    assert {"prometheus-client", "aiohttp", "opentelemetry-sdk", "kubernetes", "jinja2"} <= set(requirements)
    assert requirements["opentelemetry-sdk"] == {"otlp", "all"}
    assert "pytest" not in requirements


def test_the_wheel_built_from_the_checkout_is_this_agent(tmp_path: Path) -> None:
    """What `make dist` builds: a wheel named l9gpu-agent (the package index's "l9gpu" is
    another project) that installs the `l9gpu` command, the `exporter` and `bridge` packages
    and the files the agent reads at run time."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^dist:.*\n\trm -rf build.*\n\t\$\(PY\) -m pip wheel --quiet --no-deps --wheel-dir dist \.$", makefile, re.M)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith("l9gpu_agent-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = next(name.split("/")[0] for name in names if ".dist-info/" in name)
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(r"^Name: l9gpu-agent$", metadata, re.M)
    assert re.search(r"^l9gpu = exporter\.app\.cli:main$", entry_points, re.M)
    assert {"exporter/app/cli.py", "bridge/__init__.py", "exporter/web/page.html", "exporter/devices/simulated/scenarios/default.yaml",
            "exporter/devices/simulated/scenarios/incidents.yaml", "exporter/py.typed"} <= names
