"""Command line: ``l9gpu serve`` runs the agent, ``l9gpu snapshot`` prints one pass,
``l9gpu report`` sums cost and waste per team from Prometheus (see exporter/report/).

This module is the parser, the environment and `main`; what each command does is in
`exporter.app.serve`, `exporter.app.snapshot_cmd` and `exporter.report.cli`, built from the parts
`exporter.app.wiring` opens.

Every flag can also come from an environment variable ``L9GPU_<FLAG>`` (dashes become
underscores, e.g. ``L9GPU_INTERVAL=2s``; repeatable flags take comma-separated values;
switches take true/false). A flag on the command line wins over the environment.
Bad flags or values exit with status 2 and one line saying what is wrong.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Sequence

from exporter import __version__
from exporter.app.errors import SnapshotTimeout, UsageError
from exporter.app.logs import setup_logging
from exporter.core.bulkhead import DEFAULT_READ_TIMEOUT
from exporter.core.parsing import argtype, parse_listen, parse_positive_duration

ENV_PREFIX = "L9GPU_"
DEFAULT_LISTEN = "0.0.0.0:9835"
DEFAULT_INCIDENTS_FROM = "http://127.0.0.1:9835"
_NEGATIVE_VALUE = re.compile(r"-[0-9.][^=]*")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one clear line, not the usage dump
        raise UsageError(f"{self.prog}: {message}")

    def _parse_optional(self, arg_string: str) -> Any:
        # "-1s" is a (negative) value, not a flag: no flag begins with a digit, so the value's
        # own parser says what is wrong with it instead of "expected one argument".
        if _NEGATIVE_VALUE.fullmatch(arg_string):
            return None
        return super()._parse_optional(arg_string)


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
    from exporter import incidents

    incidents.add_arguments(serve.add_argument_group("incidents"))
    from exporter import stall

    stall.add_arguments(serve.add_argument_group("stalled GPUs (training jobs)"))
    from exporter import nodestatus

    nodestatus.add_arguments(serve.add_argument_group("node health on Kubernetes"))
    _add_schema_args(serve)
    _add_bridge_args(serve)
    snap = sub.add_parser("snapshot", help="collect once and print a table (or JSON) for an on-call engineer")
    _add_device_args(snap)
    snap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    snap.add_argument("--timeout", default="5s", type=argtype(parse_positive_duration), metavar="DURATION",
                      help="give up on a GPU that has not answered within this long (and on a driver that does "
                           "not open): it is shown stuck, with the call it is stuck in, and the others are printed "
                           "(default: 5s)")
    snap.add_argument("--incidents-from", default=DEFAULT_INCIDENTS_FROM, metavar="URL|off",
                      help="also print the recent GPU incidents the agent serving this node remembers, read from "
                           "its /api/v1/incidents, and show its health verdicts, which know each GPU's history "
                           "(an agent of another node is not read; default: %(default)s, the agent's own port when "
                           "run in its pod; off: none, the verdicts are this one pass's)")
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


def _add_schema_args(parser: argparse.ArgumentParser) -> None:
    from exporter.output.dcgm.fields import HOSTNAME_LABELS, parse_schemas

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
            from exporter.app.serve import serve

            return serve(args)
        from exporter.app.snapshot_cmd import snapshot

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
