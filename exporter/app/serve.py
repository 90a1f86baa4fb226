"""``l9gpu serve``: the agent's process, from flags to a listening socket and back."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Callable, TypeVar

from exporter import __version__
from exporter.app.errors import UsageError
from exporter.app.wiring import (
    CLOSE_TIMEOUT,
    build_collector,
    build_incident_watch,
    build_node_status,
    build_registry,
    build_stall_watch,
    close_backends_within,
    connection_limits,
    enabled_families,
    gpm_status,
    open_sources,
    select_dcgm_fields,
    web_config_watcher,
)
from exporter.attribution import Attributor
from exporter.core.model import Snapshot
from exporter.devices import Backend, close_backends, joined_name

if TYPE_CHECKING:  # what only a running agent imports (aiohttp, the OTLP bridge, the parts the flags turn on)
    from aiohttp import web

    from bridge.incident_logs import IncidentLogs
    from bridge.push import OtlpPusher
    from exporter.collect.collector import Collector
    from exporter.incidents.watch import IncidentWatch
    from exporter.nodestatus import NodeStatusWriter
    from exporter.output.counts import Rejections
    from exporter.stall.watch import StallWatch
    from exporter.web.descriptors import OpenFileLimit
    from exporter.web.exposition import Exposition
    from exporter.web.watcher import WebConfigWatcher

log = logging.getLogger("l9gpu")

T = TypeVar("T")

# Seconds a thread holding the interpreter runs before a waiting one gets it (`serve`).
SWITCH_INTERVAL = 0.001


@dataclass
class _Agent:
    """The parts of a running agent that `serve` starts and stops."""

    backends: list[Backend]
    attributor: Attributor
    collector: Collector
    app: web.Application
    rejections: Rejections
    watcher: WebConfigWatcher | None
    bridge: OtlpPusher | None
    open_files: OpenFileLimit
    watch: IncidentWatch
    node_status: NodeStatusWriter | None = None
    stall: StallWatch | None = None


def serve(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM or SIGINT."""
    # A scrape waits for the interpreter while the collector thread runs a pass or
    # renders: each time the event loop wakes it asks for the GIL, which a busy thread
    # gives up only every switch interval (5 ms by default), several times per request.
    # Asked for 1 ms at most, a scrape during a pass waits ~1 ms per wake-up, and the
    # collector pays only while a request is in flight (docs/PERFORMANCE.md).
    sys.setswitchinterval(SWITCH_INTERVAL)
    agent = _build(args)
    try:
        asyncio.run(_listen(args, agent))
    finally:
        agent.collector.stop(timeout=0.5)
        if agent.bridge is not None:
            agent.bridge.stop(timeout=0.4)  # one last push, bounded: shutdown stays within about a second
        agent.attributor.close()
        agent.watch.close()
        if agent.node_status is not None:
            agent.node_status.close(timeout=CLOSE_TIMEOUT)
        close_backends_within(agent.backends, CLOSE_TIMEOUT)
        if agent.watcher is not None:
            agent.watcher.close()
    return 0


def _build(args: argparse.Namespace) -> _Agent:
    """Open the sources and build the collector, the registry, the bridge and the app."""
    from exporter.incidents.watch import IncidentFamilies
    from exporter.output.counts import REJECTIONS_METRIC, Rejections
    from exporter.web.app import make_app
    from exporter.web.descriptors import raise_open_file_limit
    from exporter.web.exposition import Exposition
    from exporter.web.page import SnapshotPages

    enabled = enabled_families(args)
    dcgm_selection = select_dcgm_fields(args)
    rejections = Rejections()  # what the listener and the web config's checks turn away
    watcher = web_config_watcher(args.web_config, rejections)
    open_files = raise_open_file_limit()  # before attribution sizes its pidfds and /proc files by it
    backends, attributor = open_sources(args)
    if dcgm_selection is not None and not {"nvml", "simulated"} & {b.name for b in backends}:
        log.warning("the DCGM schema covers NVIDIA GPUs only: the %s backend's GPUs are exported in the l9gpu "
                    "schema only", joined_name(backends))
    collector, extra_names = build_collector(args, backends, attributor)
    registry = build_registry(lambda: collector.snapshot, enabled, extra_names, dcgm_selection)
    if REJECTIONS_METRIC in enabled:
        registry.register(rejections)
    logs: IncidentLogs | None = _from_bridge(
        backends, lambda bridge: bridge.incident_logs_from_args(args, args.node_name))
    watch = build_incident_watch(args, logs, backends)
    registry.register(IncidentFamilies(watch, enabled, extra_names))
    stall = build_stall_watch(args, watch, extra_names)
    if stall is not None:
        from exporter.stall.watch import StallFamilies

        registry.register(StallFamilies(stall, enabled, extra_names))
    node_status = build_node_status(args, watch.events)
    if node_status is not None:
        from exporter.nodestatus import NodeStatusFamilies

        registry.register(NodeStatusFamilies(node_status, enabled))
    exposition = None
    if not args.no_metrics_endpoint:
        # cached bytes may be served for a pass and its rendering, then they are stale
        # the DCGM schema: text to every scraper that takes it, as dcgm-exporter answers
        exposition = Exposition(registry, lambda: collector.snapshot, max_age=2 * args.interval,
                                interval=args.interval, prefer_text=dcgm_selection is not None)
    collector.on_snapshot = _after_each_pass(watch, exposition, node_status, stall)
    bridge: OtlpPusher | None = _from_bridge(
        backends, lambda bridge: bridge.start_from_args(args, registry, args.node_name))
    notes = _notes(node_status)
    incidents = _incidents(watch, stall)
    pages = SnapshotPages(lambda: collector.snapshot, args.node_name, args.interval, extra_names,
                          gpm_status=lambda: gpm_status(backends), incidents=incidents, notes=notes,
                          stalls=stall.gpu_entries if stall is not None else None)
    app = make_app(exposition, lambda: collector.snapshot, collector.alive, args.node_name,
                   middlewares=[watcher.middleware] if watcher is not None else (), pages=pages,
                   health=_with_notes(collector.liveness, notes), incidents=incidents)
    return _Agent(backends, attributor, collector, app, rejections, watcher, bridge, open_files, watch, node_status,
                  stall)


def _incidents(watch: IncidentWatch, stall: StallWatch | None) -> Callable[[], list]:
    """``/api/v1/incidents`` and the page's panel: the incident watch's and the stall watch's, newest first."""
    if stall is None:
        return watch.recent_json
    from exporter.stall.watch import merged_incidents

    return lambda: merged_incidents(watch.recent_json, stall.recent_json)


def _notes(node_status: NodeStatusWriter | None) -> Callable[[], list[str]]:
    """What the agent cannot do beside its passes, one line each (the node's condition)."""
    def notes() -> list[str]:
        note = node_status.note() if node_status is not None else ""
        return [note] if note else []

    return notes


def _with_notes(liveness: Callable[[], tuple[bool, str]], notes: Callable[[], list[str]]
                ) -> Callable[[], tuple[bool, str]]:
    """/healthz's (live, note) with ``notes`` added to the note: said, never a failed probe."""
    def health() -> tuple[bool, str]:
        live, note = liveness()
        return live, "; ".join([part for part in (note, *notes()) if part])

    return health


def _after_each_pass(watch: IncidentWatch, exposition: Exposition | None, node_status: NodeStatusWriter | None = None,
                     stall: StallWatch | None = None) -> Callable[[Snapshot], None]:
    """The collector's hook: the incident watch, the stall watch and the node's condition
    follow the pass, then the exposition is rendered (with the watches' counts of this pass)."""
    def hook(snapshot: Snapshot) -> None:
        try:
            watch.observe(snapshot)
        except Exception:  # noqa: BLE001 - the incidents part degrades only itself
            log.exception("following the pass for incidents failed")
        if stall is not None:
            try:
                stall.observe(snapshot)
            except Exception:  # noqa: BLE001 - the stall watch degrades only itself
                log.exception("following the pass for stalls failed")
        if node_status is not None:
            try:
                node_status.observe(snapshot)
            except Exception:  # noqa: BLE001 - the node's condition degrades only itself
                log.exception("following the pass for the node's condition failed")
        if exposition is not None:
            exposition.warm(snapshot)

    return hook


def _from_bridge(backends: list[Backend], start: Callable[[ModuleType], T]) -> T | None:
    """``start(bridge.cli)``: a part of the OTLP bridge the flags ask for (the metrics push,
    the incidents' log records), None without the bridge installed (or where the flags ask
    for none); a bad setting closes the backends and is a usage error."""
    try:
        from bridge import cli as bridge_cli
    except ImportError:
        return None
    try:
        return start(bridge_cli)
    except ValueError as exc:
        close_backends(backends)
        raise UsageError(f"l9gpu: {exc}") from None


async def _listen(args: argparse.Namespace, agent: _Agent) -> None:
    """Listen, start the collector, and serve until SIGTERM or SIGINT."""
    from aiohttp import web

    from exporter.web.logs import install_accept_error_log
    from exporter.web.site import GuardedSite

    host, port = args.listen
    watcher = agent.watcher
    ssl_context = watcher.ssl_context if watcher is not None else None
    limits, limits_warning = connection_limits(args)
    runner = web.AppRunner(agent.app, access_log=None, handle_signals=False, shutdown_timeout=0.2,
                           **limits.handler_kwargs())
    await runner.setup()
    site = GuardedSite(runner, host, port, limits, ssl_context=ssl_context, rejections=agent.rejections)
    install_accept_error_log(asyncio.get_running_loop(), site.guard.describe, rejections=agent.rejections)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(f"l9gpu: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    # Start-up objects (modules, parsers, the scenario) live for the whole run: keep
    # them out of the collector's way so a full GC pass does not stall a cycle.
    gc.collect()
    gc.freeze()
    agent.collector.start()
    log.info("%s", agent.open_files.describe())
    if limits_warning:
        log.warning("%s", limits_warning)
    scheme = watcher.scheme if watcher is not None else "http"
    log.info("l9gpu %s serving node %s with backend %s on %s://%s:%d/metrics (interval %gs; at most %d "
             "connections)", __version__, args.node_name, joined_name(agent.backends), scheme, host, port,
             args.interval, limits.max_connections)
    reload_task = asyncio.create_task(watcher.watch()) if watcher is not None else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    if reload_task is not None:
        reload_task.cancel()
    await runner.cleanup()
