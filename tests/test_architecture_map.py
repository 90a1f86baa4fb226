"""docs/ARCHITECTURE.md's map cannot go stale: every room is on it, every route in its list.

A newcomer reads the map to know where a change goes. A package or a module of exporter/'s
root (or of a package the map opens, such as devices/) that the map leaves out, or a route
the app serves that the route list lacks, fails here with its name, so the map is kept true
by the change that adds the room, not by a later reader who finds it missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp import web

from exporter.web.app import make_app

REPO = Path(__file__).resolve().parent.parent
MAP = (REPO / "docs" / "ARCHITECTURE.md").read_text()


def _rooms_block() -> str:
    section = MAP.split("## The rooms", 1)[1]
    return section.split("```", 2)[1]


ROOMS = _rooms_block()


def _rooms() -> list[str]:
    """Every package and module under exporter/, as a path relative to it (``app/``,
    ``app/cli.py``, ``devices/amd/health.py``): the map opens every folder."""
    names = []
    root = REPO / "exporter"

    def walk(place: Path, prefix: str) -> None:
        for path in sorted(place.iterdir()):
            if path.name.startswith(("_", ".")) or path.name in ("py.typed",) or path.name.endswith("_pb2.py"):
                continue
            if path.is_dir() and (path / "__init__.py").exists():
                names.append(f"{prefix}{path.name}/")
                walk(path, f"{prefix}{path.name}/")
            elif path.suffix == ".py":
                names.append(f"{prefix}{path.name}")

    walk(root, "")
    return names


def _on_map(name: str) -> bool:
    """The room's own name is on the map: ``app/`` for a folder, ``cli`` or ``cli.py`` for a
    module (the map may name a folder's modules in a line of prose)."""
    if name.endswith("/"):
        base = name.rsplit("/", 2)[-2] + "/"
    else:
        base = name.rsplit("/", 1)[-1].removesuffix(".py")
    return re.search(rf"(?<![\w.]){re.escape(base)}(?![\w])", ROOMS) is not None


def test_the_map_has_rooms():
    assert "exporter/" in ROOMS and "devices/" in ROOMS


@pytest.mark.parametrize("room", _rooms())
def test_every_room_is_on_the_map(room):
    assert _on_map(room), f"docs/ARCHITECTURE.md's map (## The rooms) does not name exporter/{room}"


def routes_of(app: web.Application) -> set[str]:
    """The paths ``app``'s router serves, a path parameter as its pattern (``/x/{name}``)."""
    paths = set()
    for resource in app.router.resources():
        info = resource.get_info()
        paths.add(info.get("path") or info.get("formatter") or "")
    return paths


def listed_routes(line: str) -> set[str]:
    """The paths a line of the map names, path parameters included (``/api/v1/gpus/{index}``)."""
    return set(re.findall(r"/[\w/{}.-]*", line))


def _served_routes() -> set[str]:
    """The routes of the app ``l9gpu serve`` builds (the simulated node's, with every part the
    defaults turn on)."""
    from exporter.app.cli import build_parser
    from exporter.app.serve import _build
    from exporter.devices import close_backends

    args = build_parser().parse_args(["serve", "--backend", "simulated"])
    agent = _build(args)
    try:
        return routes_of(agent.app)
    finally:
        agent.attributor.close()
        agent.watch.close()
        close_backends(agent.backends)


def test_a_route_with_a_path_parameter_is_read_on_both_sides():
    app = make_app(None, lambda: None, lambda: True, "node")

    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    app.router.add_get("/api/v1/gpus/{index}", handler)
    assert "/api/v1/gpus/{index}" in routes_of(app)
    assert listed_routes("app.py  routes: /metrics, /api/v1/gpus/{index}, /") == {"/metrics", "/api/v1/gpus/{index}",
                                                                               "/"}


def test_every_route_is_in_the_route_list():
    routes_line = next(line for line in ROOMS.splitlines() if line.strip().startswith("app.py"))
    listed = listed_routes(routes_line)
    served = _served_routes()
    assert "/metrics" in served and "/api/v1/snapshot" in served, f"the agent's app serves {sorted(served)}"
    missing = sorted(served - listed)
    assert not missing, f"docs/ARCHITECTURE.md's web/app.py line does not list {missing}"
