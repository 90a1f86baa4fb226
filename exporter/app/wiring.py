"""Wiring: from parsed flags to the agent's parts, under public names.

`open_sources` opens the backends and the attributor the flags ask for,
`build_collector` builds the collection thread over them, `enabled_families` and
`dcgm_selection` decide what is exported, and `build_registry` is the registry that
/metrics and the OTLP bridge both read. `l9gpu serve` (`exporter.app.serve`) and
`l9gpu snapshot` (`exporter.app.snapshot_cmd`) are made of these, and so are the
benchmarks and tests that run the agent's real parts in process.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from exporter.app.errors import SnapshotTimeout, UsageError
from exporter.attribution import Attributor
from exporter.core.model import Snapshot
from exporter.devices import Backend, close_backends, joined_name
from exporter.devices.capabilities import GpmStatus
from exporter.output import catalogue as cat

if TYPE_CHECKING:  # what only some runs import (the parts the flags turn on, optional packages)
    from kubernetes.client import CoreV1Api
    from prometheus_client import CollectorRegistry

    from bridge.incident_logs import IncidentLogs
    from exporter.collect.collector import Collector
    from exporter.devices.simulated import Scenario, SimulatedBackend
    from exporter.incidents.events import EventSink
    from exporter.incidents.watch import IncidentWatch
    from exporter.nodestatus import NodeStatusWriter
    from exporter.output.counts import Rejections
    from exporter.output.dcgm.fields import Selection
    from exporter.stall.watch import StallWatch
    from exporter.web.limits import ConnectionLimits
    from exporter.web.watcher import WebConfigWatcher

log = logging.getLogger("l9gpu")

# Seconds the agent waits for the vendor library to shut down when it exits.
CLOSE_TIMEOUT = 1.0


def open_sources(args: argparse.Namespace, wait_for_pods: float = 0.0) -> tuple[list[Backend], Attributor]:
    """Open the backends and the attributor the flags ask for (``wait_for_pods``: seconds to
    wait for the API server's first pod list; the agent waits for none). The simulated
    node's scenario goes to the attributor, which plays its pods and its kubelet."""
    from exporter import attribution, devices

    if not os.path.isdir(os.path.join(args.proc_root, "self")):
        raise UsageError(f"l9gpu: --proc-root {args.proc_root} is not a proc filesystem (no {args.proc_root}/self); "
                         "mount the host's /proc there, or run with hostPID and the default /proc")
    options = devices.options_from(args)
    wanted = gpm_keys(args)
    for backend_options in options.values():
        if backend_options.get("gpm"):  # a backend that reads GPM asks only for what is exported
            backend_options["gpm_keys"] = wanted
    try:
        backends = devices.open_backends(args.backend, options)
    except devices.BackendUnavailable as exc:
        raise UsageError(f"l9gpu: {exc}") from None
    if not args.node_name:
        known = next((name for name in (b.node_name() for b in backends) if name), "")
        args.node_name = os.environ.get("NODE_NAME") or known or socket.gethostname()
    try:
        attributor = attribution.build_attributor(args, args.node_name, wait_for_pods=wait_for_pods,
                                                  scenario=simulated_scenario(backends))
    except ValueError as exc:
        devices.close_backends(backends)
        raise UsageError(f"l9gpu: {exc}") from None
    return backends, attributor


def simulated_node(backends: Sequence[Backend]) -> SimulatedBackend | None:
    """The opened simulated backend among ``backends`` (the demo node), None on real devices."""
    from exporter.devices.simulated import SimulatedBackend

    return next((b for b in backends if isinstance(b, SimulatedBackend) and b.scenario is not None), None)


def simulated_scenario(backends: Sequence[Backend]) -> Scenario | None:
    """The scenario of the simulated node among ``backends``, whose pods and kubelet
    attribution plays; None on real devices."""
    node = simulated_node(backends)
    return node.scenario if node is not None else None


def open_sources_within(args: argparse.Namespace, timeout: float, wait_for_pods: float = 0.0
                        ) -> tuple[list[Backend], Attributor]:
    """`open_sources`, waiting at most ``timeout`` seconds (a wedged driver can block its init)."""
    from exporter.core.bulkhead import call_within
    from exporter.devices import call_prefixes

    outcome = call_within(lambda: open_sources(args, wait_for_pods=wait_for_pods), timeout, call_prefixes(),
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


def build_collector(args: argparse.Namespace, backends: list[Backend], attributor: Attributor
                    ) -> tuple[Collector, tuple[str, ...]]:
    """The collection thread over ``backends`` (not started), and the names of the
    ``--pod-label`` values its workloads carry."""
    from exporter.collect.collector import Collector
    from exporter.core.labels import label_schema

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


def enabled_families(args: argparse.Namespace) -> frozenset[str]:
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


def gpm_keys(args: argparse.Namespace) -> frozenset[str] | None:
    """The GPM metrics (`DeviceSample.gpm` keys) the exported families need: those of the
    enabled ``gpu_*`` and ``container_gpu_*`` GPM families; None (all of them) where the
    DCGM schema is served (its profiling fields are chosen by ``--collectors``) or the
    command exports no families (``l9gpu snapshot`` shows every GPM value)."""
    if not hasattr(args, "disable_metric") or list(getattr(args, "metric_schema", ("l9gpu",))) != ["l9gpu"]:
        return None
    names = enabled_families(args)
    return frozenset(key for key, suffix, *_ in cat.GPM_FAMILIES
                     if f"gpu_{suffix}" in names or f"container_gpu_{suffix}" in names)


def select_dcgm_fields(args: argparse.Namespace) -> Selection | None:
    """The DCGM fields to serve (None when the DCGM schema is off); logs what is skipped."""
    from exporter.output.dcgm import fields as dcgm

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


def build_registry(get_snapshot: Callable[[], Snapshot | None], enabled: frozenset[str],
                   extra_labels: tuple[str, ...], dcgm_selection: Selection | None = None) -> CollectorRegistry:
    """The registry /metrics and the OTLP bridge both read: snapshot + process metrics,
    plus the DCGM schema's families when ``dcgm_selection`` (`exporter.output.dcgm.fields.Selection`) is given."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    from exporter.output.render import SnapshotCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot, enabled, extra_labels))
    if dcgm_selection is not None:
        from exporter.output.dcgm.render import DcgmSnapshotCollector

        registry.register(DcgmSnapshotCollector(get_snapshot, dcgm_selection))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def connection_limits(args: argparse.Namespace) -> tuple[ConnectionLimits, str]:
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


def web_config_watcher(path: str | None, rejections: Rejections | None = None) -> WebConfigWatcher | None:
    """The --web-config watcher (None without the flag); a bad file is a usage error."""
    if not path:
        return None
    from exporter.web.watcher import WebConfigWatcher

    try:
        return WebConfigWatcher(path, rejections=rejections)
    except ValueError as exc:
        raise UsageError(f"l9gpu: --web-config {exc}") from None


def close_backends_within(backends: list[Backend], timeout: float) -> None:
    """Close the backends, waiting at most ``timeout`` seconds: with a call stuck in the
    driver, shutting the library down may block as well, and the agent must still exit."""
    from exporter.core.bulkhead import call_within
    from exporter.devices import call_prefixes

    outcome = call_within(lambda: close_backends(backends), timeout, call_prefixes(backends), name="l9gpu-close")
    if not outcome.returned:
        log.warning("closing the %s backend did not finish within %gs (stuck in %s); exiting without it",
                    joined_name(backends), timeout, outcome.call or "the vendor library")


def gpm_status(backends: Sequence[Backend]) -> dict[tuple[int, str], str]:
    """GPM status per (GPU index, MIG instance) from the backends that have GPM (`GpmStatus`)."""
    out: dict[tuple[int, str], str] = {}
    for backend in backends:
        if isinstance(backend, GpmStatus):
            out.update(backend.gpm_status())
    return out


def build_incident_watch(args: argparse.Namespace, log_records: IncidentLogs | None = None,
                         backends: Sequence[Backend] = ()) -> IncidentWatch:
    """The incident watch ``serve`` runs beside the collector (`exporter.incidents.watch`):
    the kernel log ``--kernel-log`` names, Kubernetes Events where the API is in use and
    ``--kubernetes-events on``, the peaks over ``--peak-window``, and ``log_records`` (the
    OTLP log records of `bridge.incident_logs`, or None). With ``--kernel-log auto``, the
    simulated node's own kernel log (where its scenario logs Xids:
    `exporter.incidents.simulated`) comes before the machine's."""
    from exporter.core.labels import label_schema
    from exporter.incidents.engine import IncidentConfig, IncidentTracker
    from exporter.incidents.kmsg import KernelLogUnavailable, open_kernel_log
    from exporter.incidents.simulated import scenario_kernel_log
    from exporter.incidents.watch import IncidentWatch

    extra_names, labeller = label_schema(args.pod_label or [])
    node = simulated_node(backends) if args.kernel_log == "auto" else None
    own = scenario_kernel_log(node) if node is not None else None
    try:
        kernel_log = own if own is not None else open_kernel_log(args.kernel_log)
    except KernelLogUnavailable as exc:
        raise UsageError(f"l9gpu: --kernel-log {exc}") from None
    events = None
    if args.kubernetes_events == "on" and _kubernetes_in_use(args):
        from exporter.incidents.events import EventSink, default_api_factory

        events = EventSink(lambda: default_api_factory(args.kubeconfig), args.node_name)
    config = IncidentConfig(history=args.incident_history, xid_hold=2.0 if kernel_log is not None else 0.0,
                            agent_pid=os.getpid())
    return IncidentWatch(args.node_name, labeller, extra_names,
                         tracker=IncidentTracker(args.node_name, config), kernel_log=kernel_log, events=events,
                         log_records=log_records, peak_window=args.peak_window)


def build_stall_watch(args: argparse.Namespace, watch: IncidentWatch, extra_names: Sequence[str] = ()
                      ) -> StallWatch | None:
    """The stall watch ``serve`` runs beside the incident watch (`exporter.stall.watch`), posting
    through the incident watch's event sink and OTLP log records; None with ``--stall-after off``."""
    if args.stall_after is None:
        return None
    from exporter.stall.watch import StallWatch

    return StallWatch(args.node_name, args.stall_after, extra_names, events=watch.events,
                      log_records=watch.log_records, history=args.incident_history)


def build_node_status(args: argparse.Namespace, events: EventSink | None = None) -> NodeStatusWriter | None:
    """The writer of this node's GPU condition and taint (`exporter.nodestatus`), where the
    Kubernetes API is in use and ``--node-condition on``; None otherwise. ``events``: the
    event sink the Node's Events go through (the incident watch's), or None."""
    if getattr(args, "node_condition", "off") != "on" or not _kubernetes_in_use(args):
        if getattr(args, "node_taint", "off") != "off":
            log.warning("--node-taint needs --node-condition on and the Kubernetes API: the node is not tainted")
        return None
    from exporter.nodestatus import NodeStatusWriter, Taint

    taint = Taint(args.node_taint_key) if args.node_taint == "unhealthy" else None
    return NodeStatusWriter(lambda: _node_api(args.kubeconfig), args.node_name,
                            condition_type=args.node_condition_type, heartbeat=args.node_heartbeat,
                            settle=args.node_condition_settle, taint=taint,
                            clear_on_exit=args.node_condition_clear_on_exit, events=events)


def _node_api(kubeconfig: str | None) -> CoreV1Api:
    from exporter.nodestatus.writer import default_api_factory

    return default_api_factory(kubeconfig)


def _kubernetes_in_use(args: argparse.Namespace) -> bool:
    if args.kubernetes == "off":
        return False
    if args.kubernetes == "on" or args.kubeconfig:
        return True
    from exporter.attribution.kubernetes import in_cluster

    return bool(in_cluster())
