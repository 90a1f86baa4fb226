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


# --- the image's lock ------------------------------------------------------------------------

def _lock(name: str) -> dict[str, str]:
    """Distribution (normalised) -> the version a lock file in requirements/ pins."""
    text = (REPO / "requirements" / name).read_text()
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", text, re.M)
    assert pins and all("--hash=sha256:" in block for block in re.split(r"^(?=\S)", text, flags=re.M)
                        if re.match(r"[A-Za-z0-9]", block)), f"{name}: every pin carries its hashes"
    return {_normalise(n): v for n, v in pins}


def test_the_image_lock_pins_what_the_dockerfile_installs() -> None:
    """The Dockerfile installs the agent with its [all,journal] extras from
    requirements/image.txt (``make image-lock``): every requirement of those sections is
    pinned there at a version setup.cfg accepts, with hashes; README.md names the same extras."""
    from packaging.requirements import Requirement

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lock = _lock("image.txt")
    for section in (config["options"]["install_requires"], config["options.extras_require"]["all"],
                    config["options.extras_require"]["journal"]):
        for line in filter(None, (raw.split("#", 1)[0].strip() for raw in section.splitlines())):
            requirement = Requirement(line)
            pinned = lock.get(_normalise(requirement.name))
            assert pinned is not None, f"requirements/image.txt lacks {requirement.name}: run make image-lock"
            assert requirement.specifier.contains(pinned, prereleases=True), \
                f"requirements/image.txt pins {requirement.name}=={pinned}, setup.cfg wants {requirement}: " \
                "run make image-lock"
    assert "--extra all --extra journal" in (REPO / "Makefile").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "-r /tmp/requirements/image.txt" in dockerfile and "[all,journal]" in dockerfile
    assert "with its `[all,journal]`" in (REPO / "README.md").read_text()
    build = _lock("image-build.txt")
    assert {"setuptools", "wheel"} <= set(build)
    assert re.search(r"^FROM \$\{BASE\} AS build$", dockerfile, re.M)
    assert re.search(r"^ARG BASE=python:\d+\.\d+\.\d+-slim-\w+$", dockerfile, re.M), "the base by its full version"


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    """.dockerignore leaves everything out (a checkout's .venv, .git, caches, tests) but
    what the Dockerfile's COPY lines take from the context."""
    copied = set()
    for line in re.findall(r"^COPY (?!--from)(.+)$", (REPO / "Dockerfile").read_text(), re.M):
        copied |= {p.rstrip("/") for p in line.split()[:-1]}
    ignore = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "*"
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert admitted == copied
    assert {"**/__pycache__", "**/*.pyc"} <= set(ignore)
