"""Imports point down the floors that docs/ARCHITECTURE.md draws, and never in a circle.

exporter/ is cut into floors: the types and rules everything shares (``core``, ``health``),
what reads the world (``devices``, ``attribution``), the pass and what leaves the agent
(``collect``, ``output``), what follows each pass (``incidents``, ``stall``, ``nodestatus``), what
serves it (``web``), and the commands (``app``, ``report``, ``inference``). A module may
import from a lower floor, never from a higher one, and never sideways into another folder of
its own floor unless that arrow is named here with its reason. Every import counts, the ones
inside a function or under ``TYPE_CHECKING`` too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXPORTER = REPO / "exporter"

FLOORS = {
    "core": 0, "health": 0,
    "devices": 1, "attribution": 1,
    "collect": 2, "output": 2,
    "incidents": 3, "nodestatus": 3, "stall": 3,
    "web": 4,
    "app": 5, "report": 5, "inference": 5,
}
# Arrows within one floor, each with why it is not a circle.
SIDEWAYS = {
    ("core", "health"): "the snapshot carries each GPU's health verdict (health imports nothing)",
    ("nodestatus", "incidents"): "the Node's Events name the workloads an incident found",
    ("stall", "incidents"): "a stall's Events go through the incidents' event sink",
    ("app", "report"): "the command line dispatches `l9gpu report` to its package",
    ("report", "inference"): "`l9gpu report` prices inference engines' tokens",
}


def _imports() -> list[tuple[str, str, str]]:
    """(from folder, to folder, module path) for each import of another folder of exporter/."""
    arrows = []
    for path in sorted(EXPORTER.rglob("*.py")):
        parts = path.relative_to(EXPORTER).parts
        if len(parts) < 2:
            continue
        source = parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "exporter":
                    targets = [f"exporter.{alias.name}" for alias in node.names]
                elif node.module.startswith("exporter."):
                    targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith("exporter.")]
            for target in targets:
                folder = target.split(".")[1]
                if folder != source and folder in FLOORS:
                    arrows.append((source, folder, str(path.relative_to(REPO))))
    return arrows


ARROWS = _imports()


def test_every_folder_has_a_floor():
    folders = {p.name for p in EXPORTER.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FLOORS), f"give these folders a floor: {sorted(folders ^ set(FLOORS))}"
    assert ARROWS, "no import between folders was found: the scan is broken"


@pytest.mark.parametrize("source,target,module", ARROWS, ids=[f"{m}->{t}" for s, t, m in ARROWS])
def test_imports_point_down(source, target, module):
    if FLOORS[target] == FLOORS[source]:
        assert (source, target) in SIDEWAYS, (
            f"{module} imports from exporter/{target}/, a folder on its own floor: move what it "
            f"needs down, or name the arrow in SIDEWAYS with its reason")
    else:
        assert FLOORS[target] < FLOORS[source], (
            f"{module} (floor {FLOORS[source]}, {source}/) imports from exporter/{target}/ (floor "
            f"{FLOORS[target]}): an arrow back up the floors")


def test_no_circle_between_folders():
    graph: dict[str, set[str]] = {}
    for source, target, _ in ARROWS:
        graph.setdefault(source, set()).add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    circles = sorted(f for f in graph if reaches(f, f, {f}))
    assert not circles, f"these folders import each other in a circle: {circles}"
