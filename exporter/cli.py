"""Command line: ``l9gpu serve`` runs the agent, ``l9gpu snapshot`` prints one pass.

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
from typing import Any, Callable, Sequence

from exporter import __version__
from exporter import catalogue as cat
from exporter.config import argtype, parse_listen, parse_positive_duration

log = logging.getLogger("l9gpu")

ENV_PREFIX = "L9GPU_"
DEFAULT_LISTEN = "0.0.0.0:9835"


class UsageError(Exception):
    """A user mistake in flags, environment or files: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one clear line, not the usage dump
        raise UsageError(f"{self.prog}: {message}")


def _add_device_args(parser: argparse.ArgumentParser) -> None:
    from exporter import attribution

    group = parser.add_argument_group("devices")
    group.add_argument("--backend", default="auto",
                       help="auto, nvml, amd, gaudi, simulated, or a comma-separated list for mixed nodes "
                            "(default: auto)")
    group.add_argument("--scenario", metavar="FILE",
                       help="scenario file for --backend simulated (default: the built-in node)")
    group.add_argument("--hl-smi", default="hl-smi", metavar="PATH", help="hl-smi executable for --backend gaudi")
    group.add_argument("--hl-smi-timeout", default="5s", type=argtype(parse_positive_duration), metavar="DURATION",
                       help="kill hl-smi after this long (default: 5s)")
    group.add_argument("--node-name", default=None,
                       help="value of the node label (default: $NODE_NAME, then the simulated scenario's node, "
                            "then the hostname)")
    group.add_argument("--interval", default="1s", type=argtype(parse_positive_duration), metavar="DURATION",
                       help="time between collection passes, e.g. 500ms, 2s, 1m (default: 1s)")
    group.add_argument("--process-metrics", action="store_true",
                       help="also export per-process series (pid, comm) for debugging")
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
    """The ``l9gpu`` parser with its ``serve`` and ``snapshot`` subcommands."""
    parser = _Parser(prog="l9gpu", description="GPU telemetry with per-pod and per-Slurm-job attribution.")
    parser.add_argument("--version", action="version", version=f"l9gpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    serve = sub.add_parser("serve", help="run the agent: collect every interval, serve /metrics")
    _add_device_args(serve)
    web = serve.add_argument_group("http")
    web.add_argument("--listen", default=DEFAULT_LISTEN, type=argtype(parse_listen), metavar="HOST:PORT",
                     help=f"address for /metrics, /healthz, /readyz (default: {DEFAULT_LISTEN})")
    web.add_argument("--no-metrics-endpoint", action="store_true",
                     help="serve no /metrics (push-only over OTLP); /healthz and /readyz stay")
    web.add_argument("--web-config", metavar="FILE",
                     help="TLS, client certificates, basic auth and response headers from a web config file in "
                          "Prometheus exporter-toolkit's format (as node_exporter's --web.config.file); re-read "
                          "when it changes. /healthz and /readyz need no credentials (see docs/SECURITY.md)")
    _add_bridge_args(serve)
    snap = sub.add_parser("snapshot", help="collect once and print a table (or JSON) for an on-call engineer")
    _add_device_args(snap)
    snap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    snap.add_argument("--timings", action="store_true",
                      help="also time every vendor library call of a first and a steady pass, to see why a pass "
                           "is slow on this node's driver (NVIDIA)")
    for action in (serve, snap):
        _apply_environment(action)
    return parser


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


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _open(args: argparse.Namespace) -> tuple[Any, Any]:
    """Open the backend and the attributor the flags ask for."""
    from exporter import attribution
    from exporter.devices import BackendUnavailable, open_backend

    if not os.path.isdir(os.path.join(args.proc_root, "self")):
        raise UsageError(f"l9gpu: --proc-root {args.proc_root} is not a proc filesystem (no {args.proc_root}/self); "
                         "mount the host's /proc there, or run with hostPID and the default /proc")
    options = {"scenario": args.scenario, "proc_root": args.proc_root, "hl_smi": args.hl_smi,
               "hl_smi_timeout": args.hl_smi_timeout}
    try:
        backend = open_backend(args.backend, options)
    except BackendUnavailable as exc:
        raise UsageError(f"l9gpu: {exc}") from None
    if not args.node_name:
        scenario = getattr(backend, "scenario", None)
        args.node_name = os.environ.get("NODE_NAME") or getattr(scenario, "node", "") or socket.gethostname()
    try:
        attributor = attribution.build_attributor(args, backend, args.node_name)
    except ValueError as exc:
        backend.close()
        raise UsageError(f"l9gpu: {exc}") from None
    return backend, attributor


def _collector(args: argparse.Namespace, backend: Any, attributor: Any) -> tuple[Any, tuple[str, ...]]:
    from exporter.collector import Collector
    from exporter.derive import label_schema

    extra_names, labeller = label_schema(getattr(args, "pod_label", []) or [])
    collector = Collector(backend, args.node_name, args.interval, attributor, labeller,
                          grace_seconds=args.workload_grace)
    return collector, extra_names


def _enabled(args: argparse.Namespace) -> frozenset[str]:
    enable = list(args.enable_metric)
    if args.process_metrics:
        enable += [s.name for s in cat.METRICS if s.scope == cat.PROCESS]
    try:
        return cat.enabled_names(enable, args.disable_metric)
    except ValueError as exc:
        raise UsageError(f"l9gpu: {exc}") from None


def build_registry(get_snapshot: Callable[[], Any], enabled: frozenset[str],
                   extra_labels: tuple[str, ...]) -> Any:
    """The registry /metrics and the OTLP bridge both read: snapshot + process metrics."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    from exporter.render import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot, enabled, extra_labels))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def serve(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM or SIGINT."""
    from aiohttp import web

    from exporter.server import Exposition, make_app

    enabled = _enabled(args)
    watcher = _web_config(args.web_config)
    backend, attributor = _open(args)
    collector, extra_names = _collector(args, backend, attributor)
    registry = build_registry(lambda: collector.snapshot, enabled, extra_names)
    exposition = None
    if not args.no_metrics_endpoint:
        # cached bytes may be served for a pass and its rendering, then they are stale
        exposition = Exposition(registry, lambda: collector.snapshot, max_age=2 * args.interval,
                                interval=args.interval)
        collector.on_snapshot = exposition.warm
    bridge = None
    try:
        from bridge import cli as bridge_cli

        bridge = bridge_cli.start_from_args(args, registry, args.node_name)
    except ImportError:
        pass
    except ValueError as exc:
        backend.close()
        raise UsageError(f"l9gpu: {exc}") from None
    app = make_app(exposition, lambda: collector.snapshot, collector.alive, args.node_name,
                   middlewares=[watcher.middleware] if watcher is not None else ())
    host, port = args.listen

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, shutdown_timeout=0.2,
                           ssl_context=watcher.ssl_context if watcher is not None else None)
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
        scheme = watcher.scheme if watcher is not None else "http"
        log.info("l9gpu %s serving node %s with backend %s on %s://%s:%d/metrics (interval %gs)",
                 __version__, args.node_name, backend.name, scheme, host, port, args.interval)
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
        backend.close()
        if watcher is not None:
            watcher.close()
    return 0


def _web_config(path: str | None) -> Any:
    """The --web-config watcher (None without the flag); a bad file is a usage error."""
    if not path:
        return None
    from exporter.webconfig import WebConfigWatcher

    try:
        return WebConfigWatcher(path)
    except ValueError as exc:
        raise UsageError(f"l9gpu: --web-config {exc}") from None


def snapshot(args: argparse.Namespace) -> int:
    """Collect once and print the node's GPUs and their processes' owners."""
    backend, attributor = _open(args)
    timed = [b for b in getattr(backend, "backends", [backend]) if callable(getattr(b, "enable_timings", None))]
    passes: list[tuple[str, dict[str, Any]]] = []
    try:
        collector, _ = _collector(args, backend, attributor)
        if args.timings:
            for part in timed:
                part.enable_timings()
        snap = collector.collect_once()
        if args.timings:
            # The first pass also reads what is read once or on a slow schedule; a steady
            # pass, one interval later (at most a second), is what every pass costs.
            passes.append(("first pass", _call_timings(timed)))
            time.sleep(min(args.interval, 1.0))
            snap = collector.collect_once()
            passes.append(("steady pass", _call_timings(timed)))
    finally:
        attributor.close()
        backend.close()
    if args.json:
        doc = snapshot_dict(snap)
        if args.timings:
            doc["timings"] = {name: {call: {"calls": c, "wall_seconds": w, "cpu_seconds": cpu, "max_wall_seconds": m}
                                     for call, (c, w, cpu, m) in calls.items()} for name, calls in passes}
        print(json.dumps(doc, indent=2))
    else:
        print(format_table(snap))
        if args.timings:
            print()
            print(format_timings(passes) if timed else
                  f"no per-call timings for the {backend.name} backend (NVIDIA's nvml backend has them)")
    return 0


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


def _owner(row: Any) -> str:
    w = row.workload
    if w.kind == "kubernetes":
        name = f"{w.namespace}/{w.pod}" if w.pod else f"pod {w.pod_uid or '?'}"
        return f"{name}/{w.container}" if w.container else name
    if w.kind == "slurm":
        return f"slurm job {w.slurm_job_id}" + (f" step {w.slurm_step}" if w.slurm_step else "") + (
            f" ({w.slurm_user})" if w.slurm_user else "")
    if w.kind in ("systemd", "docker"):
        return f"{w.kind} {w.unit or w.container_id[:12]}"
    return w.kind


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _allocations_by_device(snap: Any) -> dict[str, list[Any]]:
    by_device: dict[str, list[Any]] = {}
    for row in getattr(snap, "allocations", ()):
        by_device.setdefault(row.device_key, []).append(row)
    return by_device


def format_table(snap: Any) -> str:
    """A plain-text table: one line per GPU, then one indented line per process and allocation."""
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
        for row in rows:
            sm = "-" if row.sm_utilization is None else f"{row.sm_utilization * 100:.0f}%"
            lines.append(f"       pid {row.pid:<8} {row.comm[:16]:<16} {_gib(row.used_memory_bytes):>6} GiB  "
                         f"sm {sm:>4}  {_owner(row)}")
        for alloc in allocations.get(d.key, []):
            lines.append(f"       allocated to {_owner(alloc)} ({alloc.resource_name} {alloc.device_id})")
    return "\n".join(lines)


def snapshot_dict(snap: Any) -> dict[str, Any]:
    """The snapshot as plain JSON-able data (units in the key names)."""
    by_device: dict[str, list[Any]] = {}
    for row in snap.processes:
        by_device.setdefault(row.device_key, []).append(row)
    allocations = _allocations_by_device(snap)
    gpus = []
    for d in snap.devices:
        gpus.append({
            "index": d.index, "uuid": d.uuid, "model": d.model, "vendor": d.vendor,
            "gpu_instance": d.gpu_instance, "up": d.up, "error": d.error,
            "utilization_ratio": d.utilization, "memory_used_bytes": d.memory_used_bytes,
            "memory_total_bytes": d.memory_total_bytes, "power_watts": d.power_watts,
            "temperature_celsius": d.temperature_celsius,
            "processes": [{
                "pid": r.pid, "comm": r.comm, "memory_used_bytes": r.used_memory_bytes,
                "sm_utilization_ratio": r.sm_utilization, "owner": _owner(r), "kind": r.workload.kind,
                "namespace": r.workload.namespace, "pod": r.workload.pod, "container": r.workload.container,
                "pod_uid": r.workload.pod_uid, "slurm_job_id": r.workload.slurm_job_id,
                "container_id": r.workload.container_id, "owner_kind": r.workload.owner_kind,
                "owner_name": r.workload.owner_name, "slurm_step": r.workload.slurm_step,
                "slurm_user": r.workload.slurm_user, "unit": r.workload.unit,
            } for r in by_device.get(d.key, [])],
            "allocations": [{
                "namespace": a.workload.namespace, "pod": a.workload.pod, "container": a.workload.container,
                "pod_uid": a.workload.pod_uid, "resource_name": a.resource_name, "device_id": a.device_id,
            } for a in allocations.get(d.key, [])],
        })
    return {"node": snap.node, "timestamp": snap.timestamp, "gpus": gpus}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``l9gpu`` console script; returns the exit status."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        setup_logging(args.log_level, args.log_format)
        if args.command == "serve":
            return serve(args)
        return snapshot(args)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
