"""Command line: ``l9gpu serve`` runs the agent, ``l9gpu snapshot`` prints one pass,
``l9gpu report`` sums cost and waste per team from Prometheus (see exporter/report/).

Every flag can also come from an environment variable ``L9GPU_<FLAG>`` (dashes become
underscores, e.g. ``L9GPU_INTERVAL=2s``; repeatable flags take comma-separated values;
switches take true/false). A flag on the command line wins over the environment.
Bad flags or values exit with status 2 and one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from exporter import __version__
from exporter import catalogue as cat
from exporter.bulkhead import DEFAULT_READ_TIMEOUT
from exporter.devices import close_backends, joined_name
from exporter.devices.nvml.gpm import WARMING_UP
from exporter.escape import for_terminal
from exporter.parsing import argtype, parse_listen, parse_positive_duration
from exporter.snapshot_json import describe_owner, document_json, snapshot_document

log = logging.getLogger("l9gpu")

ENV_PREFIX = "L9GPU_"
DEFAULT_LISTEN = "0.0.0.0:9835"
# Seconds a thread holding the interpreter runs before a waiting one gets it (`serve`).
SWITCH_INTERVAL = 0.001
# `l9gpu snapshot` measures GPM activity over this long (two samples this far apart).
SNAPSHOT_GPM_WINDOW = 1.0
# Seconds the agent waits for the vendor library to shut down when it exits.
CLOSE_TIMEOUT = 1.0
# `l9gpu snapshot` waits this long (seconds) for the API server's pod list, for names (at
# most half its --timeout, so that a hung API server leaves time to read the GPUs).
SNAPSHOT_POD_LIST_WAIT = 10.0


class UsageError(Exception):
    """A user mistake in flags, environment or files: printed as one line, exit 2."""


class SnapshotTimeout(Exception):
    """`l9gpu snapshot` could read nothing within its --timeout: one line, exit 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one clear line, not the usage dump
        raise UsageError(f"{self.prog}: {message}")


def _add_device_args(parser: argparse.ArgumentParser) -> None:
    from exporter import attribution, devices

    group = parser.add_argument_group("devices")
    group.add_argument("--backend", default="auto",
                       help="auto, nvml, amd, gaudi, simulated, or a comma-separated list for mixed nodes "
                            "(default: auto)")
    devices.add_arguments(group, devices.SOURCE_FLAGS)  # where each backend reads its devices from
    group.add_argument("--node-name", default=None,
                       help="value of the node label (default: $NODE_NAME, then the simulated scenario's node, "
                            "then the hostname)")
    group.add_argument("--interval", default="1s", type=argtype(parse_positive_duration), metavar="DURATION",
                       help="time between collection passes, e.g. 500ms, 2s, 1m (default: 1s)")
    devices.add_arguments(group, devices.SAMPLING_FLAGS)  # how each backend samples its devices
    group.add_argument("--process-metrics", action="store_true",
                       help="also export per-process series (pid, comm) for debugging; every GPU's per-process "
                            "samples are then read every pass, also where one workload holds the GPU")
    group.add_argument("--enable-metric", action="append", default=[], metavar="NAME",
                       help="export an opt-in family (repeatable; see docs/METRICS.md)")
    group.add_argument("--disable-metric", action="append", default=[], metavar="NAME",
                       help="do not export this family (repeatable)")
    group.add_argument("--workload-grace", default="5m", type=argtype(parse_positive_duration), metavar="DURATION",
                       help="keep counters of a workload that has gone for this long (default: 5m)")
    group.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       type=str.lower, help="log level (default: info)")
    group.add_argument("--log-format", default="text", choices=["text", "json"], help="log format (default: text)")
    attribution.add_arguments(parser.add_argument_group("attribution"))


def build_parser() -> argparse.ArgumentParser:
    """The ``l9gpu`` parser with its ``serve``, ``snapshot``, ``report``, ``prices`` and ``inference-rules``
    subcommands."""
    parser = _Parser(prog="l9gpu", description="GPU telemetry with per-pod and per-Slurm-job attribution.")
    parser.add_argument("--version", action="version", version=f"l9gpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    serve = sub.add_parser("serve", help="run the agent: collect every interval, serve /metrics")
    _add_device_args(serve)
    serve.add_argument("--read-timeout", default=f"{DEFAULT_READ_TIMEOUT:g}s", type=argtype(parse_positive_duration),
                       metavar="DURATION",
                       help="a GPU whose reads in a pass take longer is reported down with the driver call it is "
                            "stuck in, and the other GPUs are read without it (Gaudi: at least --hl-smi-timeout "
                            f"plus 5s; default: {DEFAULT_READ_TIMEOUT:g}s)")
    web = serve.add_argument_group("http")
    web.add_argument("--listen", default=DEFAULT_LISTEN, type=argtype(parse_listen), metavar="HOST:PORT",
                     help=f"address for /metrics, /healthz, /readyz, the page at / and /api/v1/snapshot "
                          f"(default: {DEFAULT_LISTEN})")
    web.add_argument("--no-metrics-endpoint", action="store_true",
                     help="serve no /metrics (push-only over OTLP); /healthz and /readyz stay")
    web.add_argument("--web-config", metavar="FILE",
                     help="TLS, client certificates, basic auth and response headers from a web config file in "
                          "Prometheus exporter-toolkit's format (as node_exporter's --web.config.file); re-read "
                          "when it changes. /healthz and /readyz need no credentials (see docs/SECURITY.md)")
    _add_connection_args(web)
    _add_schema_args(serve)
    _add_bridge_args(serve)
    snap = sub.add_parser("snapshot", help="collect once and print a table (or JSON) for an on-call engineer")
    _add_device_args(snap)
    snap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    snap.add_argument("--timeout", default="5s", type=argtype(parse_positive_duration), metavar="DURATION",
                      help="give up on a GPU that has not answered within this long (and on a driver that does "
                           "not open): it is shown stuck, with the call it is stuck in, and the others are printed "
                           "(default: 5s)")
    snap.add_argument("--timings", action="store_true",
                      help="also time every vendor library call of a first and a steady pass, to see why a pass "
                           "is slow on this node's driver (NVIDIA)")
    from exporter.report import cli as report_cli

    for action in (serve, snap, *report_cli.add_parsers(sub)):
        _apply_environment(action)
    return parser


def _add_connection_args(group: Any) -> None:
    """The listener's limits (docs/SECURITY.md, "Limits")."""
    from exporter.web.limits import ConnectionLimits, parse_connections, parse_header_bytes

    d = ConnectionLimits()
    group.add_argument("--max-connections", default=d.max_connections, type=argtype(parse_connections), metavar="N",
                       help="open HTTP connections at most; lowered at start so that the open-file limit keeps "
                            "descriptors for attribution. At the limit the oldest idle or unfinished connection "
                            f"is closed to admit a new one (default: {d.max_connections})")
    group.add_argument("--keepalive-timeout", default=f"{d.keepalive_timeout:g}s",
                       type=argtype(parse_positive_duration), metavar="DURATION",
                       help=f"close a keep-alive connection idle for this long (default: {d.keepalive_timeout:g}s)")
    group.add_argument("--header-timeout", default=f"{d.header_timeout:g}s",
                       type=argtype(parse_positive_duration), metavar="DURATION",
                       help="a request's line and headers (and a TLS handshake) must arrive within this, or the "
                            f"connection is answered 408 and closed (default: {d.header_timeout:g}s)")
    group.add_argument("--max-header-bytes", default=d.max_header_bytes, type=argtype(parse_header_bytes),
                       metavar="BYTES",
                       help="a request's line and headers together at most, or 431 and the connection is closed "
                            f"(default: {d.max_header_bytes})")


def _connection_limits(args: argparse.Namespace) -> tuple[Any, str]:
    """The listener's limits from the flags, the connection cap fitted to the open-file
    limit, with descriptors kept for attribution's pidfds and /proc files; and, when the cap
    is below --max-connections, the warning to log once the agent listens."""
    import resource

    from exporter.attribution.procfs import max_kept_open
    from exporter.web.descriptors import connection_budget, descriptors_in_use
    from exporter.web.limits import ConnectionLimits

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    in_use, reserved = descriptors_in_use(), max_kept_open()
    cap = connection_budget(args.max_connections, soft, in_use, reserved)
    warning = ""
    if cap < args.max_connections:
        warning = (f"at most {cap} HTTP connections, not --max-connections {args.max_connections}: the open-file "
                   f"limit {soft} keeps {reserved} descriptors for attribution and has {in_use} in use (raise "
                   "LimitNOFILE, or ulimit -n)")
    return ConnectionLimits(max_connections=cap, keepalive_timeout=args.keepalive_timeout,
                            header_timeout=args.header_timeout, max_header_bytes=args.max_header_bytes), warning


def _add_schema_args(parser: argparse.ArgumentParser) -> None:
    from exporter.dcgm import HOSTNAME_LABELS, parse_schemas

    group = parser.add_argument_group("metric schema")
    group.add_argument("--metric-schema", default="l9gpu", type=argtype(parse_schemas), metavar="SCHEMA",
                       help="names of the exported series: l9gpu, dcgm (NVIDIA dcgm-exporter's DCGM_FI_* names, "
                            "units and labels, with honest per-pod series), or l9gpu,dcgm for both while migrating "
                            "(default: l9gpu; see docs/MIGRATING-FROM-DCGM.md)")
    group.add_argument("--collectors", metavar="FILE",
                       help="with --metric-schema dcgm: the DCGM fields to serve, from a counters file in "
                            "dcgm-exporter's CSV format (DCGM field, type, help); fields l9gpu cannot provide are "
                            "named at start-up and skipped (default: dcgm-exporter's default counters plus the "
                            "DCGM_FI_PROF_* fields)")
    group.add_argument("--dcgm-hostname-label", choices=HOSTNAME_LABELS, metavar="LABEL",
                       help="with --metric-schema dcgm: the name of the node's label, as the dcgm-exporter release "
                            "being replaced names it: Hostname (releases up to 4.5.3-4.8.2, and Grafana dashboard "
                            "12239), hostname (later releases), or none (as dcgm-exporter's --no-hostname) "
                            "(default: Hostname)")


def _dcgm_selection(args: argparse.Namespace) -> Any:
    """The DCGM fields to serve (None when the DCGM schema is off); logs what is skipped."""
    from exporter import dcgm

    hostname_label = getattr(args, "dcgm_hostname_label", None)
    if dcgm.DCGM not in args.metric_schema:
        for flag, value in (("--collectors", args.collectors), ("--dcgm-hostname-label", hostname_label)):
            if value:
                raise UsageError(f"l9gpu: {flag} needs --metric-schema dcgm (or l9gpu,dcgm)")
        return None
    hostname_label = hostname_label or dcgm.DEFAULT_HOSTNAME_LABEL
    if not args.collectors:
        selection = dcgm.default_selection()
        message = dcgm.describe_skipped(selection, "DCGM schema: default counters")
        if message:
            log.info("%s", message)
        return replace(selection, hostname_label=hostname_label)
    try:
        selection = dcgm.select(dcgm.read_counters(args.collectors))
    except dcgm.CountersError as exc:
        raise UsageError(f"l9gpu: --collectors {exc}") from None
    if not selection.metrics:
        raise UsageError(f"l9gpu: --collectors {args.collectors}: none of its fields can be served "
                         "(see docs/MIGRATING-FROM-DCGM.md)")
    message = dcgm.describe_skipped(selection, f"--collectors {args.collectors}")
    if message:
        log.warning("%s", message)
    return replace(selection, hostname_label=hostname_label)


def _add_bridge_args(parser: argparse.ArgumentParser) -> None:
    try:
        from bridge import cli as bridge_cli
    except ImportError:
        return
    bridge_cli.add_arguments(parser)


def _truthy(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise UsageError(f"l9gpu: environment variable {name}={text!r} is not a boolean (use true or false)")


def _apply_environment(parser: argparse.ArgumentParser) -> None:
    """Take defaults from L9GPU_<FLAG> environment variables."""
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public walk
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version"):
            continue
        name = ENV_PREFIX + longs[0][2:].upper().replace("-", "_")
        if name not in os.environ:
            continue
        raw = os.environ[name]
        if isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
            action.default = _truthy(name, raw)
        elif isinstance(action, argparse._AppendAction):  # noqa: SLF001
            items = [x.strip() for x in raw.split(",") if x.strip()]
            action.default = [_env_value(name, action, x) for x in items]
        else:
            action.default = _env_value(name, action, raw)


def _env_value(name: str, action: argparse.Action, raw: str) -> Any:
    value: Any = raw
    if action.type is not None:
        try:
            value = action.type(raw)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"l9gpu: environment variable {name}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise UsageError(f"l9gpu: environment variable {name}={raw!r}: choose from {choices}")
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per line (time, level, logger, message) for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """A record's message on one line, control characters written as visible escapes.

    A log line can carry text chosen by others: an API server's or a kubelet's error
    text, a request's path, a name a user chose. Written raw, a newline in it would forge
    a log line of its own and an escape sequence would drive the terminal of whoever
    reads the log (`exporter.escape.for_terminal`). A traceback keeps its lines, each
    escaped; JSON logs escape everything as JSON does.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return for_terminal(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802
        # The frames and Python's own lines keep their line breaks; an exception's
        # message (which may quote others' text) is one line, its newlines escaped.
        out = []
        for chunk in traceback.TracebackException(ei[0], ei[1], ei[2]).format():
            if chunk.startswith((" ", "\n", "Traceback ")):
                out.append(_lines_for_terminal(chunk))
            else:
                out.append(for_terminal(chunk[:-1] if chunk.endswith("\n") else chunk) + "\n")
        return "".join(out).rstrip("\n")

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _lines_for_terminal(super().formatStack(stack_info))


def _lines_for_terminal(text: str) -> str:
    return "\n".join(for_terminal(line) for line in text.split("\n"))


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _open(args: argparse.Namespace, wait_for_pods: float = 0.0) -> tuple[list[Any], Any]:
    """Open the backends and the attributor the flags ask for (``wait_for_pods``: seconds to
    wait for the API server's first pod list; the agent waits for none)."""
    from exporter import attribution, devices

    if not os.path.isdir(os.path.join(args.proc_root, "self")):
        raise UsageError(f"l9gpu: --proc-root {args.proc_root} is not a proc filesystem (no {args.proc_root}/self); "
                         "mount the host's /proc there, or run with hostPID and the default /proc")
    try:
        backends = devices.open_backends(args.backend, devices.options_from(args))
    except devices.BackendUnavailable as exc:
        raise UsageError(f"l9gpu: {exc}") from None
    if not args.node_name:
        known = next((name for name in (b.node_name() for b in backends) if name), "")
        args.node_name = os.environ.get("NODE_NAME") or known or socket.gethostname()
    try:
        attributor = attribution.build_attributor(args, backends, args.node_name, wait_for_pods=wait_for_pods)
    except ValueError as exc:
        devices.close_backends(backends)
        raise UsageError(f"l9gpu: {exc}") from None
    return backends, attributor


def _collector(args: argparse.Namespace, backends: list[Any], attributor: Any) -> tuple[Any, tuple[str, ...]]:
    from exporter.collector import Collector
    from exporter.labels import label_schema

    extra_names, labeller = label_schema(getattr(args, "pod_label", []) or [])
    # serve's --read-timeout, snapshot's --timeout
    value = getattr(args, "read_timeout", None) or getattr(args, "timeout", None)
    timeout = {"read_timeout": value} if value else {}
    # Per-process series exported: every GPU's per-process samples are read every pass.
    process_metrics = bool(getattr(args, "process_metrics", False)) or any(
        name in cat.BY_NAME and cat.get(name).scope == cat.PROCESS for name in getattr(args, "enable_metric", []) or [])
    collector = Collector(backends, args.node_name, args.interval, attributor, labeller,
                          grace_seconds=args.workload_grace, process_metrics=process_metrics, **timeout)
    return collector, extra_names


def _enabled(args: argparse.Namespace) -> frozenset[str]:
    enable = list(args.enable_metric)
    if args.process_metrics:
        enable += [s.name for s in cat.METRICS if s.scope == cat.PROCESS]
    try:
        names = cat.enabled_names(enable, args.disable_metric)
    except ValueError as exc:
        raise UsageError(f"l9gpu: {exc}") from None
    if "l9gpu" not in getattr(args, "metric_schema", ("l9gpu",)):
        # DCGM names only: keep the agent's own health families, which no DCGM name covers
        names = frozenset(name for name in names if cat.get(name).scope == cat.SELF)
        if args.process_metrics or args.enable_metric:
            log.warning("--process-metrics and --enable-metric name l9gpu families, which --metric-schema %s "
                        "does not export (use l9gpu,dcgm for both)", ",".join(args.metric_schema))
    return names


def build_registry(get_snapshot: Callable[[], Any], enabled: frozenset[str],
                   extra_labels: tuple[str, ...], dcgm_selection: Any = None) -> Any:
    """The registry /metrics and the OTLP bridge both read: snapshot + process metrics,
    plus the DCGM schema's families when ``dcgm_selection`` (`exporter.dcgm.Selection`) is given."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    from exporter.render import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot, enabled, extra_labels))
    if dcgm_selection is not None:
        from exporter.dcgm import DcgmSnapshotCollector

        registry.register(DcgmSnapshotCollector(get_snapshot, dcgm_selection))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def serve(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM or SIGINT."""
    from aiohttp import web

    from exporter.counts import REJECTIONS_METRIC, Rejections
    from exporter.web.app import make_app
    from exporter.web.descriptors import raise_open_file_limit
    from exporter.web.exposition import Exposition
    from exporter.web.logs import install_accept_error_log
    from exporter.web.site import GuardedSite

    # A scrape waits for the interpreter while the collector thread runs a pass or
    # renders: each time the event loop wakes it asks for the GIL, which a busy thread
    # gives up only every switch interval (5 ms by default), several times per request.
    # Asked for 1 ms at most, a scrape during a pass waits ~1 ms per wake-up, and the
    # collector pays only while a request is in flight (docs/PERFORMANCE.md).
    sys.setswitchinterval(SWITCH_INTERVAL)

    enabled = _enabled(args)
    dcgm_selection = _dcgm_selection(args)
    rejections = Rejections()  # what the listener and the web config's checks turn away
    watcher = _web_config(args.web_config, rejections)
    open_files = raise_open_file_limit()  # before attribution sizes its pidfds and /proc files by it
    backends, attributor = _open(args)
    backend_name = joined_name(backends)
    if dcgm_selection is not None and not {"nvml", "simulated"} & {b.name for b in backends}:
        log.warning("the DCGM schema covers NVIDIA GPUs only: the %s backend's GPUs are exported in the l9gpu "
                    "schema only", backend_name)
    collector, extra_names = _collector(args, backends, attributor)
    registry = build_registry(lambda: collector.snapshot, enabled, extra_names, dcgm_selection)
    if REJECTIONS_METRIC in enabled:
        registry.register(rejections)
    exposition = None
    if not args.no_metrics_endpoint:
        # cached bytes may be served for a pass and its rendering, then they are stale
        # the DCGM schema: text to every scraper that takes it, as dcgm-exporter answers
        exposition = Exposition(registry, lambda: collector.snapshot, max_age=2 * args.interval,
                                interval=args.interval, prefer_text=dcgm_selection is not None)
        collector.on_snapshot = exposition.warm
    bridge = None
    try:
        from bridge import cli as bridge_cli

        bridge = bridge_cli.start_from_args(args, registry, args.node_name)
    except ImportError:
        pass
    except ValueError as exc:
        close_backends(backends)
        raise UsageError(f"l9gpu: {exc}") from None
    from exporter.web.page import SnapshotPages

    pages = SnapshotPages(lambda: collector.snapshot, args.node_name, args.interval, extra_names,
                          gpm_status=lambda: gpm_status(backends))
    app = make_app(exposition, lambda: collector.snapshot, collector.alive, args.node_name,
                   middlewares=[watcher.middleware] if watcher is not None else (), pages=pages,
                   health=collector.liveness)
    host, port = args.listen

    ssl_context = watcher.ssl_context if watcher is not None else None
    limits, limits_warning = _connection_limits(args)

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.2,
                               **limits.handler_kwargs())
        await runner.setup()
        site = GuardedSite(runner, host, port, limits, ssl_context=ssl_context, rejections=rejections)
        install_accept_error_log(asyncio.get_running_loop(), site.guard.describe, rejections=rejections)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise UsageError(f"l9gpu: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        # Start-up objects (modules, parsers, the scenario) live for the whole run: keep
        # them out of the collector's way so a full GC pass does not stall a cycle.
        gc.collect()
        gc.freeze()
        collector.start()
        log.info("%s", open_files.describe())
        if limits_warning:
            log.warning("%s", limits_warning)
        scheme = watcher.scheme if watcher is not None else "http"
        log.info("l9gpu %s serving node %s with backend %s on %s://%s:%d/metrics (interval %gs; at most %d "
                 "connections)", __version__, args.node_name, backend_name, scheme, host, port, args.interval,
                 limits.max_connections)
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

    try:
        asyncio.run(run())
    finally:
        collector.stop(timeout=0.5)
        if bridge is not None:
            bridge.stop(timeout=0.4)  # one last push, bounded: shutdown stays within about a second
        attributor.close()
        _close_backend(backends, CLOSE_TIMEOUT)
        if watcher is not None:
            watcher.close()
    return 0


def _close_backend(backends: list[Any], timeout: float) -> None:
    """Close the backends, waiting at most ``timeout`` seconds: with a call stuck in the
    driver, shutting the library down may block as well, and the agent must still exit."""
    from exporter.bulkhead import call_within
    from exporter.devices import call_prefixes

    outcome = call_within(lambda: close_backends(backends), timeout, call_prefixes(backends), name="l9gpu-close")
    if not outcome.returned:
        log.warning("closing the %s backend did not finish within %gs (stuck in %s); exiting without it",
                    joined_name(backends), timeout, outcome.call or "the vendor library")


def _web_config(path: str | None, rejections: Any = None) -> Any:
    """The --web-config watcher (None without the flag); a bad file is a usage error."""
    if not path:
        return None
    from exporter.web.watcher import WebConfigWatcher

    try:
        return WebConfigWatcher(path, rejections=rejections)
    except ValueError as exc:
        raise UsageError(f"l9gpu: --web-config {exc}") from None


def snapshot(args: argparse.Namespace) -> int:
    """Collect once and print the node's GPUs and their processes' owners.

    Where a GPU has GPM, its activity needs two samples: a second pass follows the
    first after `SNAPSHOT_GPM_WINDOW` seconds, and the second pass is printed.
    """
    if args.gpm_interval is not None:
        args.gpm_interval = 0.0  # sample on each of the (at most two) passes
    backends, attributor = _open_within(args, args.timeout,
                                        wait_for_pods=min(SNAPSHOT_POD_LIST_WAIT, args.timeout / 2))
    timed: list[Any] = []
    passes: list[tuple[str, dict[str, Any]]] = []
    collector = None
    try:
        collector, extra_names = _collector(args, backends, attributor)
        if args.timings:
            timed = [b for b in backends if b.enable_timings()]
        snap = collector.collect_once()
        gpm_warming = any(status == WARMING_UP for status in gpm_status(backends).values())
        if args.timings:
            # The first pass also reads what is read once or on a slow schedule; a steady
            # pass, one interval later (at most a second), is what every pass costs.
            passes.append(("first pass", _call_timings(timed)))
        if args.timings or gpm_warming:
            time.sleep(max(min(args.interval, 1.0) if args.timings else 0.0,
                           SNAPSHOT_GPM_WINDOW if gpm_warming else 0.0))
            snap = collector.collect_once()
        if args.timings:
            passes.append(("steady pass", _call_timings(timed)))
        statuses = gpm_status(backends)
    finally:
        if collector is not None:
            collector.stop()
        attributor.close()
        _close_backend(backends, min(args.timeout, CLOSE_TIMEOUT))
    if args.json:
        doc = snapshot_document(snap, extra_names, statuses)
        if args.timings:
            doc["timings"] = {name: {call: {"calls": c, "wall_seconds": w, "cpu_seconds": cpu, "max_wall_seconds": m}
                                     for call, (c, w, cpu, m) in calls.items()} for name, calls in passes}
        sys.stdout.write(document_json(doc))
    else:
        print(format_table(snap, statuses))
        for call in snap.stuck:  # a stuck GPU is in the table, down; this lists the other parts
            if not call.devices:
                print(f"{call.what}: stuck in {call.call} for {call.seconds:.1f} s")
        if args.timings:
            print()
            print(format_timings(passes) if timed else
                  f"no per-call timings for the {joined_name(backends)} backend (NVIDIA's nvml backend has them)")
            if any(name.startswith("nvmlGpm") for _, calls in passes for name in calls):
                print("(nvmlGpm* calls: this snapshot samples GPM on both passes; `l9gpu serve` samples a GPU "
                      "every --gpm-interval)")
    return 0


def _open_within(args: argparse.Namespace, timeout: float, wait_for_pods: float = 0.0) -> tuple[list[Any], Any]:
    """`_open`, waiting at most ``timeout`` seconds (a wedged driver can block its init)."""
    from exporter.bulkhead import call_within
    from exporter.devices import call_prefixes

    outcome = call_within(lambda: _open(args, wait_for_pods=wait_for_pods), timeout, call_prefixes(),
                          name="l9gpu-open")
    if not outcome.returned:
        backend = "GPU" if args.backend == "auto" else args.backend
        if outcome.call:  # stuck in the vendor library
            what = f"the {backend} backend did not open within {timeout:g}s (stuck in {outcome.call})"
        else:  # elsewhere: attribution's sources (the API server, the container runtime)
            what = f"opening the {backend} backend and attribution did not finish within {timeout:g}s"
        raise SnapshotTimeout(f"l9gpu: {what}; nothing could be read")
    if outcome.error is not None:
        raise outcome.error
    backends, attributor = outcome.value
    return backends, attributor


def _call_timings(backends: list[Any]) -> dict[str, Any]:
    calls: dict[str, Any] = {}
    for part in backends:
        calls.update(part.timings(reset=True))
    return calls


def format_timings(passes: list[tuple[str, dict[str, Any]]]) -> str:
    """What each vendor library call cost in each timed pass, costliest first."""
    lines = []
    for title, calls in passes:
        wall = sum(t[1] for t in calls.values()) * 1e3
        cpu = sum(t[2] for t in calls.values()) * 1e3
        lines.append(f"{title}: {sum(t[0] for t in calls.values())} calls, {wall:.2f} ms wall, {cpu:.2f} ms CPU")
        lines.append(f"  {'CALL':<46}{'CALLS':>6}{'WALL ms':>10}{'CPU ms':>9}{'PER CALL ms':>13}{'MAX ms':>9}")
        for name, (count, w, c, slowest) in sorted(calls.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"  {name:<46}{count:>6}{w * 1e3:>10.3f}{c * 1e3:>9.3f}{w * 1e3 / max(count, 1):>13.3f}"
                         f"{slowest * 1e3:>9.3f}")
    return "\n".join(lines)


def gpm_status(backends: list[Any]) -> dict[tuple[int, str], str]:
    """GPM status per (GPU index, MIG instance) from the backends that have GPM."""
    out: dict[tuple[int, str], str] = {}
    for backend in backends:
        out.update(backend.gpm_status())
    return out


def _gpm_line(device: Any, status: str | None) -> str | None:
    """One line of GPM activity for the table, or why there is none."""
    gpm = device.gpm
    if gpm:
        parts = [f"{label} {gpm[key] * 100:.0f}%" for label, key in (
            ("graphics", "graphics_active"), ("sm", "sm_active"), ("occupancy", "sm_occupancy"),
            ("tensor", "tensor_active"), ("dram", "dram_active")) if key in gpm]
        return "       gpm: " + "  ".join(parts)
    if status and status.startswith("unsupported: "):
        return f"       gpm: not available ({status[len('unsupported: '):]})"
    return None


def _owner(row: Any) -> str:
    return describe_owner(row.workload)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _allocations_by_device(snap: Any) -> dict[str, list[Any]]:
    by_device: dict[str, list[Any]] = {}
    for row in getattr(snap, "allocations", ()):
        by_device.setdefault(row.device_key, []).append(row)
    return by_device


def format_table(snap: Any, gpm: Mapping[tuple[int, str], str] | None = None) -> str:
    """A plain-text table: one line per GPU, then its GPM activity (or why it has none) and
    one indented line per process and allocation.

    Process names, pod, namespace and container names and Slurm fields are chosen by the
    node's users, and device names and errors come from the driver: every line is passed
    through `escape.for_terminal`, so a control character is printed as ``\\x1b`` and the
    like, never sent to the operator's terminal.
    """
    lines = [f"node {snap.node}",
             f"{'GPU':<4} {'MODEL':<28} {'UTIL':>5} {'MEMORY GiB':>14} {'POWER W':>8}  PROCESSES"]
    by_device: dict[str, list[Any]] = {}
    for row in snap.processes:
        by_device.setdefault(row.device_key, []).append(row)
    allocations = _allocations_by_device(snap)
    for d in snap.devices:
        gpu = f"{d.index}" + (f"/{d.gpu_instance}" if d.gpu_instance else "")
        if not d.up:
            lines.append(f"{gpu:<4} {d.model[:28]:<28} DOWN: {d.error}")
            continue
        util = "-" if d.utilization is None else f"{d.utilization * 100:.0f}%"
        mem = f"{_gib(d.memory_used_bytes)}/{_gib(d.memory_total_bytes)}"
        power = "-" if d.power_watts is None else f"{d.power_watts:.0f}"
        rows = by_device.get(d.key, [])
        lines.append(f"{gpu:<4} {d.model[:28]:<28} {util:>5} {mem:>14} {power:>8}  {len(rows)}")
        gpm_line = _gpm_line(d, (gpm or {}).get((d.index, d.gpu_instance)))
        if gpm_line:
            lines.append(gpm_line)
        for row in rows:
            sm = "-" if row.sm_utilization is None else f"{row.sm_utilization * 100:.0f}%"
            lines.append(f"       pid {row.pid:<8} {row.comm[:16]:<16} {_gib(row.used_memory_bytes):>6} GiB  "
                         f"sm {sm:>4}  {_owner(row)}")
        for alloc in allocations.get(d.key, []):
            lines.append(f"       allocated to {_owner(alloc)} ({alloc.resource_name} {alloc.device_id})")
    return "\n".join(for_terminal(line) for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``l9gpu`` console script; returns the exit status."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if args.command in ("report", "prices", "inference-rules"):
            from exporter.report import cli as report_cli

            return report_cli.run(args)
        setup_logging(args.log_level, args.log_format)
        if args.command == "serve":
            return serve(args)
        return snapshot(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except SnapshotTimeout as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
