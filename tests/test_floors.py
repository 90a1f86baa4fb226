"""Imports point down the floors that docs/ARCHITECTURE.md draws, and never in a circle.

exporter/ is cut into floors: the types and rules everything shares (``core``, ``health``),
what reads the world (``devices``, ``attribution``), the pass and what leaves the agent
(``collect``, ``output``), what follows each pass (``incidents``, ``stall``, ``nodestatus``), what
serves it (``web``), and the commands (``app``, ``report``, ``inference``). A module may
import from a lower floor, never from a higher one, and never sideways into another folder of
its own floor unless that arrow is named here with its reason. Every import counts, the ones
inside a function or under ``TYPE_CHECKING`` too: a lazy import is still a dependency.

Inside a folder the same holds module by module: no two modules of one package (its
sub-packages included) import each other, directly or round a longer circle; a circle is
named module by module, so a lazy import that hides one shows where to cut.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator

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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(EXPORTER.rglob("*.py"))}


def _imported_modules(name: str, path: Path) -> Iterator[str]:
    """The modules of exporter/ that module ``name`` imports, anywhere in its text: ``from
    a.b import c`` is module ``a.b.c`` where that is a module, else ``a.b``; relative
    imports resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _package_graph() -> dict[str, set[str]]:
    """Module -> the modules of its own folder of exporter/ it imports."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        folder = name.split(".")[:2]
        graph[name] = {target for target in _imported_modules(name, path)
                       if target in MODULES and target != name and target.split(".")[:2] == folder}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each group of modules that reach each other (Tarjan's strongly
    connected components), as the modules in import order, the first repeated at the end."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_shortest_circle(graph, group) for group in groups]


def _shortest_circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest circle from the group's first module back to itself (breadth first)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # a strongly connected group always has one


def test_the_module_scan_sees_imports_inside_packages():
    graph = _package_graph()
    assert "exporter.output.spec" in graph["exporter.output.catalogue"], "the module scan is broken"
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_circle_between_modules_of_a_package():
    circles = _circles(_package_graph())
    assert not circles, "modules of one package import each other in a circle (function-local imports count): " + \
        "; ".join(" -> ".join(circle) for circle in circles)


def _claims() -> list[tuple[str, str]]:
    """(folder, what docs/ARCHITECTURE.md's map says it imports: "nothing" or "only X/") for each
    folder whose line in the map says it."""
    rooms = (REPO / "docs" / "ARCHITECTURE.md").read_text().split("## The rooms", 1)[1].split("```", 2)[1]
    text = re.sub(r"\s+", " ", rooms)
    return [(folder, claim) for folder, claim in
            re.findall(r"(?<![\w/])(\w+)/ [^/]*?imports (nothing of the agent|only \w+/)", text)]


def test_what_the_map_says_a_folder_imports_is_what_it_imports():
    claims = _claims()
    assert "core" in dict(claims), f"the map's line about core/ is not read: {claims}"
    for folder, claim in claims:
        allowed = set() if claim.startswith("nothing") else {claim.removeprefix("only ").rstrip("/")}
        imported = {target for source, target, _ in ARROWS if source == folder}
        assert imported <= allowed, (f"docs/ARCHITECTURE.md says exporter/{folder}/ imports {claim}, but it "
                                     f"imports from {sorted(imported)}: mend the sentence or the imports")
