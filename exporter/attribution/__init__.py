"""Attribution: from a GPU process's PID to the workload that owns it.

The collector calls `Attributor.resolve` once per pass with every GPU PID it saw.
`build_attributor` returns a `resolver.ProcAttributor`: it reads each PID's cgroup file
under ``--proc-root`` (`procfs`, `cgroups`), and joins the pod UID and container id it
finds with pod names from the Kubernetes API watch (`kubernetes`) and, for pods the API
has not named (API server off or unreachable), from the container runtime's CRI socket
(`cri`). The kubelet's pod-resources socket (`podresources`) says which container
was allocated which GPU, joined to the same index. `NullAttributor`
knows no owners (every process counts as unattributed); the collector uses it when
given none. See docs/ATTRIBUTION.md.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from exporter.core.labels import parse_pod_label_key
from exporter.core.model import UNKNOWN, AllocationRow, DeviceSample, Workload
from exporter.core.parsing import argtype

if TYPE_CHECKING:
    from exporter.attribution.simulated import SimulatedNode

__all__ = ["KUBERNETES_MODES", "Attributor", "NullAttributor", "add_arguments", "build_attributor"]

log = logging.getLogger(__name__)


class Attributor(Protocol):
    """Maps host PIDs to workloads. Called from the collector thread only."""

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        """Return the owner of each PID (missing PIDs count as unknown)."""

    def comm(self, pid: int) -> str:
        """The process's short command name ("" when unknown)."""

    def start_time(self, pid: int) -> float | None:
        """When the process started, seconds since boot (None when unknown)."""

    @property
    def generation(self) -> int:
        """A number that changes whenever `comm` or `start_time` may answer otherwise for
        some PID: while it stays, the pass takes last pass's names and starts for the PIDs
        whose processes and owners are the last pass's, without asking."""

    def allocations(self, devices: Sequence[DeviceSample]) -> tuple[AllocationRow, ...] | None:
        """The GPUs the kubelet allocated to containers, joined to ``devices`` (None: unknown)."""

    def statuses(self) -> Mapping[str, bool]:
        """Health of the attribution sources, by collector name (for self-metrics)."""

    def info(self) -> Mapping[str, float]:
        """Extra self facts for the snapshot (e.g. host_pids_visible)."""

    def close(self) -> None:
        """Stop background threads (API watch) and release sockets."""


class NullAttributor:
    """Knows no owners: every GPU process is unattributed."""

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        return {pid: UNKNOWN for pid in pids}

    def comm(self, pid: int) -> str:
        return ""

    def start_time(self, pid: int) -> float | None:
        return None

    generation = 0  # no name, no start: nothing ever changes

    def allocations(self, devices: Sequence[DeviceSample]) -> tuple[AllocationRow, ...] | None:
        return None

    def statuses(self) -> Mapping[str, bool]:
        return {}

    def info(self) -> Mapping[str, float]:
        return {}

    def close(self) -> None:
        return None


KUBERNETES_MODES = ("auto", "on", "off")


def add_arguments(group: Any) -> None:
    """Add attribution flags to the CLI (an argparse parser or group)."""
    group.add_argument("--proc-root", default="/proc", metavar="DIR",
                       help="where the host's /proc is mounted (default: /proc; needs hostPID or a host mount)")
    group.add_argument("--kubernetes", default="auto", choices=KUBERNETES_MODES, type=str.lower,
                       help="pod names from the Kubernetes API: auto (when in a cluster or $KUBECONFIG is set), "
                            "on (fail if unavailable), off (default: auto)")
    group.add_argument("--kubeconfig", default=None, metavar="FILE",
                       help="kubeconfig for the API server (default: in-cluster service account, then $KUBECONFIG)")
    group.add_argument("--pod-label", action="append", default=[], metavar="KEY", type=argtype(parse_pod_label_key),
                       help="copy this pod label onto workload series as label_<key> (repeatable)")
    group.add_argument("--cri-socket", default="auto", metavar="PATH",
                       help="the container runtime's CRI socket, for pod and container names the API server has not "
                            "given: a path, auto (the first of /run/containerd/containerd.sock, "
                            "/run/k3s/containerd/containerd.sock, /run/crio/crio.sock that exists) or off "
                            "(default: auto)")
    group.add_argument("--pod-resources-socket", default="auto", metavar="PATH",
                       help="the kubelet's pod-resources socket, for which container was allocated which GPU "
                            "(container_gpu_allocated): a path, auto (/var/lib/kubelet/pod-resources/kubelet.sock "
                            "if it exists) or off (default: auto)")


def _simulated(scenario: SimulatedNode, allocations: bool = True) -> Attributor:
    """The simulated node: a fixture /proc tree, its pods and its kubelet, read by the real code.

    ``allocations`` False (``--pod-resources-socket off``) leaves the kubelet's allocations out.
    """
    import shutil
    import tempfile

    from exporter.attribution.kubernetes import PodIndex, StaticPodSource
    from exporter.attribution.podresources import StaticAllocationSource
    from exporter.attribution.simulated import (
        SimulatedAttributor,
        scenario_allocatable,
        scenario_allocations,
        scenario_pods,
        write_proc_tree,
    )

    root = tempfile.mkdtemp(prefix="l9gpu-simulated-proc-")
    write_proc_tree(root, scenario.processes)
    index = PodIndex()
    source = StaticPodSource(index, scenario_pods(scenario.processes, scenario.allocations))
    return SimulatedAttributor(root, index, source, on_close=lambda: shutil.rmtree(root, ignore_errors=True),
                          allocation_source=StaticAllocationSource(scenario_allocations(scenario),
                                                                   scenario_allocatable(scenario))
                          if allocations else None)


def _pod_watcher(args: argparse.Namespace, node: str, index: Any) -> Any:
    """The API watch the flags ask for, or None (``auto`` outside a cluster)."""
    mode = getattr(args, "kubernetes", "auto") or "auto"
    kubeconfig = getattr(args, "kubeconfig", None)
    if mode == "off" or (mode == "auto" and not kubeconfig):
        from exporter.attribution.kubernetes import in_cluster

        if mode == "off" or not in_cluster():
            log.debug("pod names from the Kubernetes API are off (%s)", "--kubernetes off" if mode == "off"
                      else "not in a cluster and no kubeconfig")
            return None
    try:
        from exporter.attribution.kubernetes import PodWatcher, load_client

        api_client = load_client(kubeconfig)
        watcher = PodWatcher(api_client, node, index)
    except ImportError:
        if mode == "on":
            raise ValueError("--kubernetes on needs the kubernetes package (pip install '.[k8s]' in l9gpu's checkout "
                             "or pip install kubernetes)") from None
        log.warning("the kubernetes package is not installed: pods are identified by UID only")
        return None
    except Exception as exc:  # noqa: BLE001 - bad kubeconfig, missing token, ...
        if mode == "on":
            raise ValueError(f"--kubernetes on: cannot configure the API client: {exc}") from None
        log.warning("cannot configure the Kubernetes API client (%s): pods are identified by UID only", exc)
        return None
    return watcher


def _cri_source(args: argparse.Namespace, index: Any) -> Any:
    """The CRI fallback the flags ask for, started, or None (off, no socket, no CRI there)."""
    value = str(getattr(args, "cri_socket", "auto") or "auto").strip()
    if value.lower() == "off":
        return None
    from exporter.attribution import cri
    from exporter.attribution.unixgrpc import socket_path

    auto = value.lower() == "auto"
    path = cri.detect_socket() if auto else socket_path(value)
    if path is None:
        log.debug("pod names from the container runtime are off: none of %s exists", ", ".join(cri.CRI_SOCKETS))
        return None
    source = cri.build(path, index, detected=auto)
    if source is None:
        return None
    source.start()
    return source


def _pod_resources_source(args: argparse.Namespace) -> Any:
    """The kubelet pod-resources client the flags ask for, started, or None (off, no socket)."""
    from exporter.attribution import podresources

    value = str(getattr(args, "pod_resources_socket", "auto") or "auto")
    path = podresources.resolve_socket(value)
    if path is None:
        log.debug("GPU allocations from the kubelet are off (%s)", "--pod-resources-socket off"
                  if value.strip().lower() == "off" else f"no {podresources.POD_RESOURCES_SOCKET}")
        return None
    return podresources.build(path)


def build_attributor(args: argparse.Namespace, node: str, wait_for_pods: float = 0.0,
                     scenario: SimulatedNode | None = None) -> Attributor:
    """Build the attributor the CLI flags ask for.

    The simulated node (``scenario``: the simulated backend's scenario, handed over by
    the wiring; `exporter.attribution.simulated.SimulatedNode` says what is read of it) gets a
    fixture /proc tree, its pods and its kubelet; real devices get ``--proc-root`` and,
    where configured, the Kubernetes API watch of this node's pods and the container
    runtime's CRI socket (``--cri-socket``) for pods the API has not named, and the
    kubelet's pod-resources socket (``--pod-resources-socket``) for allocations.

    The API watch lists pods in its own thread: nothing here waits on the API server,
    unless ``wait_for_pods`` (seconds) asks to wait for its first list (a one-shot
    ``l9gpu snapshot`` wants names on its only pass; the agent must listen at once).

    Raises:
        ValueError: the flags ask for something unavailable (``--kubernetes on``
            without the package or a configuration).
    """
    if scenario is not None:
        off = str(getattr(args, "pod_resources_socket", "auto") or "auto").strip().lower() == "off"
        return _simulated(scenario, allocations=not off)
    from exporter.attribution.kubernetes import PodIndex
    from exporter.attribution.resolver import ProcAttributor

    index = PodIndex()
    watcher = _pod_watcher(args, node, index)
    if watcher is not None:
        watcher.start()  # lists, then watches; failures are logged and retried there
        if wait_for_pods > 0 and not watcher.wait_listed(wait_for_pods):
            log.warning("the Kubernetes API server has not answered the pod list within %gs: pods are named by UID "
                        "until it does", wait_for_pods)
    return ProcAttributor(getattr(args, "proc_root", "/proc") or "/proc", index, watcher,
                          fallback=_cri_source(args, index), allocation_source=_pod_resources_source(args))
