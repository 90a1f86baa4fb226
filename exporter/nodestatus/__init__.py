"""GPU health where Kubernetes acts on it: a condition on this node's Node, Events on the
Node when a GPU's verdict changes, and an opt-in taint (docs/HEALTH.md, "On the Node").

- `exporter.nodestatus.condition` works out, purely, what one pass says: the condition
  (``True`` while a GPU needs more than its application restarted), the GPUs' transitions;
- `exporter.nodestatus.writer` writes it through the API server from a thread of its own,
  counted in ``l9gpu_kubernetes_node_updates_total{outcome}``.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector

from exporter.core.parsing import argtype, parse_positive_duration
from exporter.nodestatus.condition import DEFAULT_CONDITION_TYPE
from exporter.nodestatus.writer import DEFAULT_TAINT_KEY, OUTCOMES, NodeStatusWriter, Taint
from exporter.output import catalogue as cat

__all__ = ["DEFAULT_CONDITION_TYPE", "DEFAULT_TAINT_KEY", "MODES", "OUTCOMES", "TAINT_MODES", "NodeStatusFamilies",
           "NodeStatusWriter", "Taint", "add_arguments"]

MODES = ("on", "off")
TAINT_MODES = ("off", "unhealthy")
# A condition type: CamelCase, optionally behind a DNS prefix (example.com/GPUProblem).
_DNS_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
_CONDITION_TYPE = re.compile(_DNS_PREFIX + r"[A-Za-z][A-Za-z0-9]{0,62}")
# A taint key: a label key (an optional DNS prefix, a name of at most 63 characters).
_TAINT_KEY = re.compile(_DNS_PREFIX + r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def parse_condition_type(text: str) -> str:
    value = str(text).strip()
    if not _CONDITION_TYPE.fullmatch(value) or len(value) > 316:
        raise ValueError(f"{value!r} is not a condition type (CamelCase letters and digits, e.g. GPUUnhealthy, "
                         "optionally behind a DNS prefix: example.com/GPUUnhealthy)")
    return value


def parse_taint_key(text: str) -> str:
    value = str(text).strip()
    prefix = value.rsplit("/", 1)[0] if "/" in value else ""
    if not _TAINT_KEY.fullmatch(value) or len(prefix) > 253:
        raise ValueError(f"{value!r} is not a taint key (a label key such as l9gpu.io/gpu-unhealthy)")
    return value


def add_arguments(group: Any) -> None:
    """The flags of the node part of ``l9gpu serve`` (docs/HEALTH.md, "On the Node")."""
    group.add_argument("--node-condition", default="on", choices=MODES, type=str.lower,
                       help="write a condition for this node's GPUs on its Node (True while a GPU needs a reset, a "
                            "reboot or hardware inspection), with Events on the Node when a GPU's verdict changes "
                            "(needs get on nodes and patch on nodes/status; default: on, where the Kubernetes API "
                            "is in use)")
    group.add_argument("--node-condition-type", default=DEFAULT_CONDITION_TYPE, type=argtype(parse_condition_type),
                       metavar="TYPE", help=f"the condition's type (default: {DEFAULT_CONDITION_TYPE})")
    group.add_argument("--node-heartbeat", default="1m", type=argtype(parse_positive_duration), metavar="DURATION",
                       help="write an unchanged condition again this often, no more (default: 1m)")
    group.add_argument("--node-condition-settle", default="2m", type=argtype(parse_positive_duration),
                       metavar="DURATION",
                       help="for this long after the first pass, keep a True condition a previous agent left "
                            "while this agent's verdict says False: some reasons take several health reads to be "
                            "seen again (default: 2m)")
    group.add_argument("--node-condition-clear-on-exit", action="store_true",
                       help="set the condition False and remove the taint when the agent stops cleanly (default: "
                            "keep them, so that a rollout does not make a sick node look healthy for a moment)")
    group.add_argument("--node-taint", default="off", choices=TAINT_MODES, type=str.lower,
                       help="unhealthy: taint the node NoSchedule while its condition is True, and remove the taint "
                            "when every GPU is healthy or needs at most its application restarted (needs patch on "
                            "nodes; default: off, since one bad GPU of eight would keep new pods off the seven good "
                            "ones)")
    group.add_argument("--node-taint-key", default=DEFAULT_TAINT_KEY, type=argtype(parse_taint_key), metavar="KEY",
                       help=f"the taint's key (default: {DEFAULT_TAINT_KEY})")


class NodeStatusFamilies(PrometheusCollector):
    """``l9gpu_kubernetes_node_updates_total`` on the registry (`catalogue.REGISTERED_ELSEWHERE`)."""

    def __init__(self, writer: NodeStatusWriter, enabled: frozenset[str]):
        self.writer = writer
        self.enabled = enabled

    def collect(self) -> Iterator[Metric]:
        name = "l9gpu_kubernetes_node_updates_total"
        if name not in self.enabled:
            return
        spec = cat.get(name)
        counter = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
        for outcome, count in self.writer.counts().items():
            counter.add_metric((outcome,), float(count))
        yield counter

    def describe(self) -> Iterator[Metric]:
        return iter(())
