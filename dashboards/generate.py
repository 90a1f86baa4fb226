"""Build the Grafana dashboards in this directory.

    python dashboards/generate.py          # rewrite l9gpu-*.json
    python dashboards/generate.py --check  # exit 1 if a committed file differs

The JSON files are committed so they can be imported as they are (Grafana UI, a
provisioning directory, or a ConfigMap with the Grafana sidecar's label); this script is
the one place their panels are written, so that every panel shares the same variables,
units and layout rules. tests/test_dashboards.py evaluates every expression here against a
real Prometheus scraping the agent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}

# Selectors every panel starts from. `$node`, `$namespace`, `$gpu` are multi-value
# variables whose "All" value is `.*`, so `=~` keeps working when everything is selected.
DEV = 'node=~"$node", gpu=~"$gpu"'
WL = 'node=~"$node", gpu=~"$gpu", namespace=~"$namespace"'
POD = WL + ', pod!=""'
# Self-metrics without a `node` label get it from l9gpu_host_pids_visible of the same target.
WITH_NODE = ('on (instance, job) group_left (node) '
             'group by (instance, job, node) (l9gpu_host_pids_visible{node=~"$node"})')
# Inference rules per workload (alerts/l9gpu-inference.rules.yaml).
P_ALLOC = "namespace_pod:container_gpu_allocation_seconds:rate5m"
P_TOKENS = "namespace_pod:l9gpu_inference_tokens:rate5m"


class Board:
    """Lays panels out on Grafana's 24-column grid, left to right, top to bottom."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = 0
        self._y = 0
        self._row_h = 0
        self._id = 0

    def _next_id(self) -> int:
        self._id += 1
        return self._id

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": self._next_id(), "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y}, "panels": []})
        self._y += 1

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_h
            self._x = 0
            self._row_h = 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> dict[str, Any]:
        if self._x + w > 24:
            self._newline()
        panel["id"] = self._next_id()
        panel["gridPos"] = {"h": h, "w": w, "x": self._x, "y": self._y}
        self._x += w
        self._row_h = max(self._row_h, h)
        self.panels.append(panel)
        return panel


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto",
                         "range": not instant, "instant": instant}
    if table:
        t["format"] = "table"
    return t


def timeseries(title: str, targets: list[dict[str, Any]], unit: str, description: str = "", *,
               stack: bool = False, minimum: float | None = 0, maximum: float | None = None,
               overrides: list[dict[str, Any]] | None = None, thresholds: list[tuple[str, float | None]] | None = None,
               draw: str = "line") -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {"drawStyle": draw, "lineWidth": 1, "fillOpacity": 30 if stack else 10, "showPoints": "never",
                   "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                   "spanNulls": False},
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if thresholds:
        defaults["thresholds"] = _thresholds(thresholds)
        defaults["custom"]["thresholdsStyle"] = {"mode": "dashed"}
    return {"type": "timeseries", "title": title, "description": description, "datasource": DS, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def _thresholds(steps: list[tuple[str, float | None]]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for color, value in steps]}


def stat(title: str, targets: list[dict[str, Any]], unit: str, description: str = "",
         thresholds: list[tuple[str, float | None]] | None = None, decimals: int | None = None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "thresholds": _thresholds(thresholds or [("green", None)]),
                                "color": {"mode": "thresholds"}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {"type": "stat", "title": title, "description": description, "datasource": DS, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "auto"}}


def table(title: str, targets: list[dict[str, Any]], description: str = "", *, hide: list[str] | None = None,
          rename: dict[str, str] | None = None, sort: str | None = None,
          overrides: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An instant-query table; several targets are merged on their common labels.

    Overrides name columns as renamed (``rename`` maps ``Value #A`` to a header).
    """
    excluded = {"Time": True, "__name__": True, "job": True, "instance": True, "uuid": True, "pod_uid": True,
                "gpu_instance": True, "model": True}
    for name in hide or []:
        excluded[name] = True
    transformations: list[dict[str, Any]] = []
    if len(targets) > 1:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({"id": "organize", "options": {"excludeByName": excluded, "renameByName": rename or {}}})
    if sort:
        transformations.append({"id": "sortBy", "options": {"sort": [{"field": sort, "desc": True}]}})
    return {"type": "table", "title": title, "description": description, "datasource": DS, "targets": targets,
            "fieldConfig": {"defaults": {"custom": {"align": "auto", "filterable": True}},
                            "overrides": overrides or []},
            "options": {"showHeader": True, "footer": {"show": False}},
            "transformations": transformations}


def bargauge(title: str, targets: list[dict[str, Any]], unit: str, description: str = "",
             maximum: float | None = None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "min": 0, "color": {"mode": "continuous-GrYlRd"},
                                "thresholds": _thresholds([("green", None)])}
    if maximum is not None:
        defaults["max"] = maximum
    return {"type": "bargauge", "title": title, "description": description, "datasource": DS, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}}


def by_name(name: str, **props: Any) -> dict[str, Any]:
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": key.replace("__", "."), "value": value} for key, value in props.items()]}


def by_regexp(pattern: str, **props: Any) -> dict[str, Any]:
    return {"matcher": {"id": "byRegexp", "options": pattern},
            "properties": [{"id": key.replace("__", "."), "value": value} for key, value in props.items()]}


def variable(name: str, label: str, query: str, *, multi: bool = True) -> dict[str, Any]:
    return {"type": "query", "name": name, "label": label, "datasource": DS,
            "query": {"query": query, "refId": f"{name}-query"}, "definition": query,
            "refresh": 2, "sort": 3, "multi": multi, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "regex": "",
            "hide": 0}


def dashboard(uid: str, title: str, description: str, board: Board, variables: list[dict[str, Any]],
              tags: list[str]) -> dict[str, Any]:
    datasource = {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
                  "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}
    return {
        "uid": uid, "title": title, "description": description, "tags": tags,
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "timezone": "",
        "templating": {"list": [datasource, *variables]},
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "l9gpu dashboards", "type": "dashboards", "tags": ["l9gpu"], "asDropdown": True,
                   "includeVars": True, "keepTime": True}],
        "panels": board.panels,
    }


NODE_VAR = variable("node", "Node", "label_values(gpu_info, node)")
GPU_VAR = variable("gpu", "GPU", 'label_values(gpu_info{node=~"$node"}, gpu)')
NAMESPACE_VAR = variable("namespace", "Namespace",
                         'label_values(container_gpu_memory_used_bytes{node=~"$node"}, namespace)')


def workloads() -> dict[str, Any]:
    b = Board()
    b.row("Overview")
    b.add(stat("GPUs", [target(f"count(gpu_up{{{DEV}}})", instant=True)], "none",
               "GPUs the agents report on the selected nodes."), 4, 4)
    b.add(stat("GPUs held by workloads",
               [target(f"count(count by (node, uuid) (container_gpu_memory_used_bytes{{{WL}}} > 0))", instant=True)],
               "none", "GPUs on which at least one pod or Slurm job holds memory."), 4, 4)
    b.add(stat("GPUs of compute in use",
               [target(f"sum(rate(container_gpu_usage_seconds_total{{{WL}}}[$__rate_interval]))", instant=True)],
               "none", "Sum of SM shares: 1.0 is one GPU fully busy.", decimals=2), 4, 4)
    b.add(stat("Idle holders",
               [target(f"count(container_gpu_idle_seconds{{{WL}}} > 600"
                       f" and container_gpu_memory_used_bytes{{{WL}}} > 0) or vector(0)", instant=True)],
               "none", "Workloads holding GPU memory with zero SM for more than 10 minutes.",
               thresholds=[("green", None), ("orange", 1)]), 4, 4)
    b.add(stat("Unattributed GPU memory",
               [target(f"sum(gpu_unattributed_memory_used_bytes{{{DEV}}})", instant=True)], "bytes",
               "Memory held by processes that belong to no pod or Slurm job (host processes, or PIDs the "
               "agent cannot see).", thresholds=[("green", None), ("orange", 1)]), 4, 4)
    b.add(stat("Attributed power",
               [target(f"sum(rate(container_gpu_energy_joules_total{{{WL}}}[$__rate_interval]))", instant=True)],
               "watt", "Power drawn on behalf of workloads (busy energy by SM share, idle energy by memory share)."),
          4, 4)

    b.row("Workloads")
    b.add(timeseries("GPU memory by pod",
                     [target(f"sum by (namespace, pod, container) (container_gpu_memory_used_bytes{{{POD}}})",
                             "{{namespace}}/{{pod}}/{{container}}")],
                     "bytes", "Device memory held by each container's processes, summed over its GPUs.", stack=True),
          12, 9)
    b.add(timeseries("SM share by pod and GPU",
                     [target(f"container_gpu_utilization_ratio{{{POD}}}",
                             "{{namespace}}/{{pod}}/{{container}} gpu {{gpu}}")],
                     "percentunit", "Each container's share of a GPU's SM time over the agent's last interval.",
                     maximum=1), 12, 9)
    b.add(timeseries("GPUs of compute by namespace",
                     [target(f"sum by (namespace) (rate(container_gpu_usage_seconds_total{{{WL}, namespace!=\"\"}}"
                             "[$__rate_interval]))",
                             "{{namespace}}")],
                     "none", "GPU-seconds of compute per second (1.0 = one GPU fully busy); "
                             "`namespace:container_gpu_usage_seconds:rate5m` records the same over 5m.",
                     stack=True), 12, 8)
    b.add(timeseries("GPU processes by pod",
                     [target(f"sum by (namespace, pod) (container_gpu_processes{{{POD}}})", "{{namespace}}/{{pod}}")],
                     "none", "GPU processes of each pod on the selected GPUs.", stack=True, draw="bars"), 12, 8)

    b.row("Idle holders (zombies)")
    zombie = f"container_gpu_idle_seconds{{{WL}}} > 0"
    b.add(table("Holding GPU memory without computing", [
        target(f"sort_desc({zombie})", ref="A", instant=True, table=True),
        target(f"container_gpu_memory_used_bytes{{{WL}}} and ({zombie})", ref="B", instant=True, table=True),
    ], "Workloads that hold GPU memory and have run no kernel for the time shown, longest first. "
       "Over an hour this fires GPUZombieWorkload.",
        rename={"Value #A": "idle for", "Value #B": "memory held"}, sort="idle for", overrides=[
            by_name("idle for", unit="s", thresholds=_thresholds([("green", None), ("orange", 600), ("red", 3600)]),
                    custom__cellOptions={"type": "color-background", "mode": "basic"}),
            by_name("memory held", unit="bytes"),
        ]), 24, 8)

    unused = f"(container_gpu_allocated{{{WL}}} == 1 and container_gpu_processes{{{WL}}} == 0)"
    b.add(table("GPUs allocated but unused", [
        target(f"sort_desc(container_gpu_idle_seconds{{{WL}}} and {unused})", ref="A", instant=True, table=True),
    ], "Containers the device plugin gave a GPU (kubelet pod-resources) that run no process on it, longest "
       "first: the whole GPU is reserved and does nothing. Over an hour this fires GPUAllocatedButUnused.",
        rename={"Value #A": "allocated and unused for"}, sort="allocated and unused for", overrides=[
            by_name("allocated and unused for", unit="s",
                    thresholds=_thresholds([("green", None), ("orange", 600), ("red", 3600)]),
                    custom__cellOptions={"type": "color-background", "mode": "basic"}),
        ]), 24, 6)

    b.row("Tensor-core use (GPM: Hopper and newer, GPUs used by one workload)")
    gpm_note = (" From NVML GPM, on GPUs (or MIG instances) whose processes all belong to one workload; a shared "
                "GPU has device series only (devices dashboard).")
    b.add(timeseries("Tensor-core activity by pod",
                     [target(f"container_gpu_tensor_active_ratio{{{POD}}}",
                             "{{namespace}}/{{pod}}/{{container}} gpu {{gpu}}")],
                     "percentunit", "Fraction of time any tensor-core pipe was active: the matrix math of training "
                                    "and inference." + gpm_note, maximum=1), 12, 8)
    b.add(timeseries("SM activity by pod",
                     [target(f"container_gpu_sm_active_ratio{{{POD}}}",
                             "{{namespace}}/{{pod}}/{{container}} gpu {{gpu}}")],
                     "percentunit", "Fraction of time the SMs had work resident, averaged over all SMs. High SM "
                                    "activity with no tensor activity is a busy GPU doing no matrix math." + gpm_note,
                     maximum=1), 12, 8)
    busy = (f"avg_over_time(container_gpu_sm_active_ratio{{{WL}}}[30m]) > 0.5"
            f" and max_over_time(container_gpu_tensor_active_ratio{{{WL}}}[30m]) < 0.01")
    b.add(table("Busy without tensor work (last 30 minutes)", [
        target(f"sort_desc({busy})", ref="A", instant=True, table=True),
        target(f"max_over_time(container_gpu_tensor_active_ratio{{{WL}}}[30m]) and ({busy})", ref="B", instant=True,
               table=True),
        target(f"container_gpu_memory_used_bytes{{{WL}}} and ({busy})", ref="C", instant=True, table=True),
    ], "Containers alone on a GPU whose SMs were over 50% active on average over 30 minutes while the tensor "
       "cores stayed idle: a rank stuck in a collective, a busy-wait. Held for 15 more minutes (with FP pipes idle "
       "too) this fires GPUBusyWithoutTensorWork.",
        rename={"Value #A": "SM active (30m avg)", "Value #B": "tensor active (30m max)", "Value #C": "memory held"},
        sort="SM active (30m avg)", overrides=[
            by_name("SM active (30m avg)", unit="percentunit"),
            by_name("tensor active (30m max)", unit="percentunit"),
            by_name("memory held", unit="bytes"),
        ]), 24, 6)

    b.row("Chargeback (selected time range)")
    cb = WL + ', namespace!=""'
    b.add(table("Per namespace", [
        target(f"sum by (namespace) (increase(container_gpu_usage_seconds_total{{{cb}}}[$__range])) / 3600",
               ref="A", instant=True, table=True),
        target(f"sum by (namespace) (increase(container_gpu_allocation_seconds_total{{{cb}}}[$__range])) / 3600",
               ref="B", instant=True, table=True),
        target(f"sum by (namespace) (increase(container_gpu_energy_joules_total{{{cb}}}[$__range])) / 3.6e6",
               ref="C", instant=True, table=True),
    ], "GPU-hours of compute (integral of SM share), GPU-hours held (time holding memory on a GPU) and "
       "attributed energy over the dashboard's time range.", sort="GPU-hours (compute)",
        rename={"Value #A": "GPU-hours (compute)", "Value #B": "GPU-hours (allocated)", "Value #C": "energy"},
        overrides=[
            by_name("GPU-hours (compute)", unit="h", decimals=2),
            by_name("GPU-hours (allocated)", unit="h", decimals=2),
            by_name("energy", unit="kwatth", decimals=3),
        ]), 12, 9)
    b.add(bargauge("GPU-hours (compute) by namespace", [
        target(f"sort_desc(sum by (namespace) (increase(container_gpu_usage_seconds_total{{{cb}}}[$__range])) / 3600)",
               "{{namespace}}", instant=True)], "h"), 6, 9)
    b.add(bargauge("Energy by namespace", [
        target(f"sort_desc(sum by (namespace) (increase(container_gpu_energy_joules_total{{{cb}}}[$__range])) / 3.6e6)",
               "{{namespace}}", instant=True)], "kwatth"), 6, 9)
    b.add(timeseries("Attributed power by namespace",
                     [target(f"sum by (namespace) (rate(container_gpu_energy_joules_total{{{WL}}}[$__rate_interval]))",
                             "{{namespace}}"),
                      target(f"sum(rate(gpu_unattributed_energy_joules_total{{{DEV}}}[$__rate_interval]))",
                             "unattributed / idle", ref="B")],
                     "watt", "Workload energy plus unattributed energy adds up to the GPUs' energy.", stack=True),
          24, 8)

    b.row("Cost (selected time range)")
    # Prices come from `l9gpu prices FILE` (recording rules); the chargeback rules record the
    # price per namespace and model while it is in use, so a namespace gone before the end of
    # the range keeps its price through last_over_time.
    price = "last_over_time(namespace_model:l9gpu_gpu_hour_price[$__range])"
    kwh = "last_over_time(namespace:l9gpu_kwh_price[$__range])"

    def cost(counter: str) -> str:
        return (f"sum by (namespace) (increase({counter}{{{cb}}}[$__range])"
                f" * on (namespace, model) group_left () {price}) / 3600")

    allocated = cost("container_gpu_allocation_seconds_total")
    effective = cost("container_gpu_usage_seconds_total")
    energy = (f"sum by (namespace) (increase(container_gpu_energy_joules_total{{{cb}}}[$__range]))"
              f" * on (namespace) {kwh} / 3.6e6")
    waste = f"({allocated}) - ({effective} or {allocated} * 0)"
    waste_ratio = (f"1 - (sum by (namespace) (increase(container_gpu_usage_seconds_total{{{cb}}}[$__range]))"
                   f" / sum by (namespace) (increase(container_gpu_allocation_seconds_total{{{cb}}}[$__range])))")
    money = "In the prices file's currency (`l9gpu prices FILE` loads it into Prometheus; docs/CHARGEBACK.md)."
    b.add(stat("Allocated cost", [target(f"sum({allocated})", instant=True)], "none",
               "GPU-hours held (allocated, or holding memory) x price per GPU-hour. " + money, decimals=2), 5, 4)
    b.add(stat("Effective cost", [target(f"sum({effective})", instant=True)], "none",
               "GPU-hours of compute (SM time) x price per GPU-hour. " + money, decimals=2), 5, 4)
    b.add(stat("Waste", [target(f"sum({allocated}) - sum({effective})", instant=True)], "none",
               "Allocated minus effective cost: GPU time paid for and not computed with. " + money, decimals=2,
               thresholds=[("green", None), ("orange", 1)]), 5, 4)
    b.add(stat("Waste ratio",
               [target(f"1 - sum(increase(container_gpu_usage_seconds_total{{{cb}}}[$__range]))"
                       f" / sum(increase(container_gpu_allocation_seconds_total{{{cb}}}[$__range]))", instant=True)],
               "percentunit", "Share of allocated GPU time not used for compute.", decimals=1,
               thresholds=[("green", None), ("orange", 0.3), ("red", 0.6)]), 4, 4)
    b.add(stat("Energy cost", [target(f"sum({energy})", instant=True)], "none",
               "Attributed energy x price per kWh. " + money, decimals=2), 5, 4)
    # What the GPUs cost, held or not: capacity (GPU-seconds offered) x the model's price.
    model_price = "last_over_time(model:l9gpu_gpu_hour_price[$__range])"

    def gpu_cost(counter: str) -> str:
        return (f"sum(sum by (model) (increase({counter}{{{DEV}}}[$__range]))"
                f" * on (model) group_left () {model_price}) / 3600")

    b.add(stat("GPU cost", [target(gpu_cost("gpu_capacity_seconds_total"), instant=True)], "none",
               "What the GPUs cost over the range, held or not: their GPU-hours x each model's price. The "
               "namespaces' allocated cost, the Slurm jobs', the unallocated cost and the price overrides add up "
               "to it (a shared GPU's hour is paid once). " + money, decimals=2), 12, 4)
    b.add(stat("Unallocated cost", [target(gpu_cost("gpu_unallocated_seconds_total"), instant=True)], "none",
               "GPU time no workload held (time-slicing replicas nobody was given, idle GPUs, GPUs down) x price: "
               "what the platform pays for itself. " + money, decimals=2,
               thresholds=[("green", None), ("orange", 1)]), 12, 4)
    b.add(table("Cost per namespace", [
        target(allocated, ref="A", instant=True, table=True),
        target(effective, ref="B", instant=True, table=True),
        target(waste, ref="C", instant=True, table=True),
        target(waste_ratio, ref="D", instant=True, table=True),
        target(energy, ref="E", instant=True, table=True),
    ], "Allocated cost (GPU-hours held x price), effective cost (GPU-hours of compute x price), their difference "
       "(waste), the share of allocated time wasted, and energy cost, over the dashboard's time range. "
       "`l9gpu report` gives the same per pod label or Slurm account, as CSV, JSON or HTML. " + money,
        rename={"Value #A": "allocated cost", "Value #B": "effective cost", "Value #C": "waste",
                "Value #D": "waste ratio", "Value #E": "energy cost"}, sort="allocated cost", overrides=[
            by_name("allocated cost", decimals=2), by_name("effective cost", decimals=2),
            by_name("waste", decimals=2), by_name("energy cost", decimals=2),
            by_name("waste ratio", unit="percentunit", decimals=1,
                    thresholds=_thresholds([("green", None), ("orange", 0.3), ("red", 0.6)]),
                    custom__cellOptions={"type": "color-background", "mode": "basic"}),
        ]), 24, 8)
    b.add(timeseries("Allocated cost per hour by namespace",
                     [target('namespace:l9gpu_allocated_cost_per_hour:rate5m{namespace=~"$namespace"}',
                             "{{namespace}}"),
                      target("cluster:l9gpu_slurm_allocated_cost_per_hour:rate5m", "(Slurm jobs)", ref="B"),
                      target("cluster:l9gpu_unallocated_cost_per_hour:rate5m", "(unallocated)", ref="C"),
                      target("cluster:l9gpu_price_overrides_cost_per_hour:rate5m", "(price overrides)", ref="D")],
                     "none", "What the GPUs each namespace holds cost per hour (recorded by the chargeback rules), "
                             "with the Slurm jobs, the time nobody held and what namespace price overrides took "
                             "off: with every namespace shown the stack is the GPUs' cost per hour. "
                             + money, stack=True), 12, 8)
    b.add(timeseries("Waste per hour by namespace",
                     [target('namespace:l9gpu_allocated_cost_per_hour:rate5m{namespace=~"$namespace"}'
                             ' - (namespace:l9gpu_effective_cost_per_hour:rate5m{namespace=~"$namespace"}'
                             ' or namespace:l9gpu_allocated_cost_per_hour:rate5m{namespace=~"$namespace"} * 0)',
                             "{{namespace}}")],
                     "none", "Allocated minus effective cost per hour: held GPU time not computed with. " + money,
                     stack=True), 12, 8)

    b.row("Memory growth")
    b.add(timeseries("GPU memory in one hour, as a share of the GPU (linear forecast)",
                     [target(f"predict_linear(container_gpu_memory_used_bytes{{{POD}}}[30m], 3600)"
                             " / on (node, uuid, gpu_instance) group_left ()"
                             f" gpu_memory_total_bytes{{{DEV}}}",
                             "{{namespace}}/{{pod}}/{{container}} gpu {{gpu}}")],
                     "percentunit", "predict_linear over 30 minutes, one hour ahead. Above 100% the container is on "
                                    "course to run out of GPU memory (GPUMemoryGrowthToOOM).",
                     thresholds=[("green", None), ("orange", 0.9), ("red", 1)]), 24, 8)

    b.add(timeseries("Time until GPU memory is full (autoscaler input)",
                     [target('namespace_pod:l9gpu_gpu_memory_full_in_seconds:deriv30m{namespace=~"$namespace"}',
                             "{{namespace}}/{{pod}}")],
                     "s", "Free memory of each workload's GPUs over its own growth in the last 30 minutes, the soonest "
                          "of its GPUs (recorded by l9gpu.rules.yaml for KEDA's Prometheus scaler or an HPA through "
                          "prometheus-adapter). Only workloads whose GPU memory grows appear: inference engines "
                          "preallocate theirs, watch their KV cache below instead.",
                     thresholds=[("red", None), ("orange", 3600), ("green", 6 * 3600)]), 24, 7)

    b.row("Inference: tokens and what they cost (engines' own /metrics, docs/INFERENCE.md)")
    ns = 'namespace=~"$namespace"'
    pm = "namespace_pod_model_name:l9gpu_inference_"
    inference_note = (" Per served model (model_name, from each engine's /metrics joined with the GPU time of its pod "
                      "on namespace and pod; a pod serving several models splits its GPU time by their tokens).")

    def per_million(numerator: str, scale: str, window: str | None = None) -> str:
        def total(name: str) -> str:
            series = f"{pm}{name}:rate5m{{{ns}}}"
            return f"sum by (model_name) (sum_over_time({series}[{window}]))" if window else \
                f"sum by (model_name) ({series})"
        return f"{total(numerator)} {scale} / ({total('tokens')} > 0)"

    b.add(table("Per model (selected time range)", [
        target(per_million("allocated_cost_per_hour", "/ 3600 * 1e6", "$__range"), ref="A", instant=True, table=True),
        target(per_million("effective_cost_per_hour", "/ 3600 * 1e6", "$__range"), ref="B", instant=True, table=True),
        target(per_million("energy_joules", "/ 3.6e6 * 1e6", "$__range"), ref="C", instant=True, table=True),
        target(per_million("allocated_gpu_seconds", "* 1e6", "$__range"), ref="D", instant=True, table=True),
        target(f"count by (model_name) (count_over_time({pm}tokens:rate5m{{{ns}}}[$__range]))", ref="E",
               instant=True, table=True),
    ], "Cost per million tokens on the allocated basis (the GPU time the model's pods held, a time-shared GPU by "
       "their share) and the used basis (their SM time), energy and GPU-seconds per million tokens, and the "
       "replicas that served the model, over the dashboard's time range (from the recorded 5-minute rates). "
       "`l9gpu report --by model` gives the exact figures for a period." + inference_note,
        rename={"Value #A": "cost / M tokens", "Value #B": "cost / M tokens (used)", "Value #C": "kWh / M tokens",
                "Value #D": "GPU-s / M tokens", "Value #E": "replicas"}, sort="cost / M tokens", overrides=[
            by_name("cost / M tokens", decimals=3), by_name("cost / M tokens (used)", decimals=3),
            by_name("kWh / M tokens", unit="kwatth", decimals=3), by_name("GPU-s / M tokens", unit="s", decimals=0),
        ]), 24, 7)
    b.add(timeseries("Tokens per second by model",
                     [target(f"sum by (model_name) ({pm}prompt_tokens:rate5m{{{ns}}})", "{{model_name}} prompt"),
                      target(f"sum by (model_name) ({pm}generated_tokens:rate5m{{{ns}}})", "{{model_name}} generated",
                             ref="B")],
                     "suffix: tok/s", "Prompt (prefill) and generated tokens per second." + inference_note,
                     stack=True), 12, 8)
    b.add(timeseries("Cost per million tokens by model",
                     [target(per_million("allocated_cost_per_hour", "/ 3600 * 1e6"), "{{model_name}}"),
                      target(per_million("effective_cost_per_hour", "/ 3600 * 1e6"), "{{model_name}} (used)",
                             ref="B")],
                     "none", "What a million tokens cost: the GPU time the model's pods held x price (their share of "
                             "a time-shared GPU), and dashed what their SM time cost. Idle replicas make every token "
                             "dearer." + inference_note + " " + money,
                     overrides=[by_regexp(".* \\(used\\)", custom__lineStyle={"fill": "dash", "dash": [10, 10]})]),
          12, 8)
    b.add(timeseries("Energy per million tokens by model",
                     [target(per_million("energy_joules", "/ 3.6e6 * 1e6"), "{{model_name}}")],
                     "kwatth", "The GPU energy of the model's pods (their share of each GPU's) per million tokens."
                     + inference_note), 12, 8)
    b.add(timeseries("KV-cache usage by pod",
                     [target(f"{pm}kv_cache_usage:ratio{{{ns}}}", "{{namespace}}/{{pod}} {{model_name}}")],
                     "percentunit", "Share of each engine's KV cache in use. Near full while the engine preempts "
                                    "requests fires GPUInferenceKVCacheSaturation: scale out. (TGI publishes no "
                                    "KV-cache gauge.)", maximum=1,
                     thresholds=[("green", None), ("orange", 0.8), ("red", 0.9)]), 12, 8)
    b.add(timeseries("Requests running and waiting by pod",
                     [target(f"{pm}requests_running{{{ns}}}", "{{namespace}}/{{pod}} {{model_name}} running"),
                      target(f"{pm}requests_waiting{{{ns}}}", "{{namespace}}/{{pod}} {{model_name}} waiting",
                             ref="B"),
                      target(f"{pm}preemptions:rate5m{{{ns}}}", "{{namespace}}/{{pod}} {{model_name}} preempted/s",
                             ref="C")],
                     "none", "Requests in the running batch, queued, and preempted per second (vLLM preemptions, "
                             "SGLang retractions): a growing queue with preemptions is a replica out of KV cache."),
          12, 8)
    b.add(table("Idle replicas: holding GPUs, serving no token", [
        target(f"sort_desc({P_ALLOC}{{{ns}}} > 0 and on (namespace, pod) {P_TOKENS} == 0)", ref="A", instant=True,
               table=True),
    ], "Inference workloads that hold GPU time (their share of time-shared GPUs) and served no token in the last 5 "
       "minutes. After 30 minutes this fires GPUInferenceReplicaIdle: scale in, or to zero.",
        rename={"Value #A": "GPUs held"}, sort="GPUs held", overrides=[by_name("GPUs held", decimals=2)]), 12, 8)

    b.row("Who is on each GPU")
    who = b.add(timeseries("GPU $gpu on $node: memory by holder", [
        target(f"sum by (namespace, pod) (container_gpu_memory_used_bytes{{{POD}}})", "{{namespace}}/{{pod}}"),
        target(f'sum by (slurm_job_id) (container_gpu_memory_used_bytes{{{DEV}, slurm_job_id!=""}})',
               "slurm job {{slurm_job_id}}", ref="B"),
        target(f"sum(gpu_unattributed_memory_used_bytes{{{DEV}}})", "unattributed", ref="C"),
        target(f"sum(gpu_memory_total_bytes{{{DEV}}})", "total", ref="D"),
    ], "bytes", "Memory of each pod and Slurm job on this GPU, stacked, with memory no workload owns on top; the "
                "dashed line is the GPU's total. One panel per selected GPU index; pick one node to read one GPU.",
        stack=True, overrides=[
        by_name("total", custom__stacking={"mode": "none", "group": "A"}, custom__fillOpacity=0,
                custom__lineStyle={"fill": "dash", "dash": [10, 10]}, color={"mode": "fixed", "fixedColor": "red"}),
        by_name("unattributed", color={"mode": "fixed", "fixedColor": "gray"}),
    ]), 12, 8)
    who["repeat"] = "gpu"
    who["repeatDirection"] = "h"
    who["maxPerRow"] = 2
    b.row("Slurm jobs")
    sj = 'node=~"$node", gpu=~"$gpu", slurm_job_id!=""'
    b.add(table("Slurm jobs on GPUs", [
        target(f"sum by (slurm_job_id, node, gpu) (container_gpu_memory_used_bytes{{{sj}}})", ref="A", instant=True,
               table=True),
        target(f"sum by (slurm_job_id, node, gpu) (container_gpu_utilization_ratio{{{sj}}})", ref="B", instant=True,
               table=True),
        target(f"sum by (slurm_job_id, node, gpu) (increase(container_gpu_usage_seconds_total{{{sj}}}[$__range]))"
               " / 3600",
               ref="C", instant=True, table=True),
        target(f"sum by (slurm_job_id, node, gpu) (increase(container_gpu_energy_joules_total{{{sj}}}[$__range]))"
               " / 3.6e6",
               ref="D", instant=True, table=True),
    ], "Slurm jobs holding GPUs on the selected nodes (processes in a slurmstepd cgroup).",
        rename={"Value #A": "memory", "Value #B": "SM share", "Value #C": "GPU-hours (compute)", "Value #D": "energy"},
        sort="memory", overrides=[
            by_name("memory", unit="bytes"), by_name("SM share", unit="percentunit"),
            by_name("GPU-hours (compute)", unit="h", decimals=2), by_name("energy", unit="kwatth", decimals=3),
        ]), 12, 8)
    b.add(timeseries("GPUs of compute by Slurm job", [
        target(f"sum by (slurm_job_id) (rate(container_gpu_usage_seconds_total{{{sj}}}[$__rate_interval]))",
               "job {{slurm_job_id}}")], "none", "GPU-seconds of compute per second for each Slurm job.", stack=True),
        12, 8)
    return dashboard("l9gpu-workloads", "l9gpu / GPU workloads",
                     "GPU memory, compute, idle holders and chargeback per namespace, pod, container and Slurm job.",
                     b, [NODE_VAR, NAMESPACE_VAR, GPU_VAR], ["l9gpu", "gpu", "kubernetes"])


def devices() -> dict[str, Any]:
    b = Board()
    leg = "{{node}} gpu {{gpu}}"
    b.row("Overview")
    b.add(stat("GPUs up", [target(f"sum(gpu_up{{{DEV}}})", instant=True)], "none",
               "GPUs read successfully in the agent's last pass."), 4, 4)
    b.add(stat("GPUs down", [target(f"count(gpu_up{{{DEV}}} == 0) or vector(0)", instant=True)], "none",
               "GPUs the agent could not read (lost, driver error).", thresholds=[("green", None), ("red", 1)]), 4, 4)
    b.add(stat("Mean utilisation", [target(f"avg(gpu_utilization_ratio{{{DEV}}})", instant=True)], "percentunit"),
          4, 4)
    b.add(stat("Power", [target(f"sum(gpu_power_watts{{{DEV}}})", instant=True)], "watt"), 4, 4)
    b.add(stat("Energy (time range)",
               [target(f"sum(increase(gpu_energy_joules_total{{{DEV}}}[$__range])) / 3.6e6", instant=True)],
               "kwatth", decimals=2), 4, 4)
    b.add(stat("XID errors (time range)",
               [target(f"sum(increase(gpu_xid_errors_total{{{DEV}}}[$__range])) or vector(0)", instant=True)],
               "none", thresholds=[("green", None), ("red", 1)]), 4, 4)
    b.add(table("GPUs", [target(f"gpu_info{{{DEV}}}", instant=True, table=True)],
                "Model, driver, PCI bus id and serial of each GPU.", hide=["Value"]), 24, 6)

    b.row("Utilisation and memory")
    b.add(timeseries("GPU utilisation", [target(f"gpu_utilization_ratio{{{DEV}}}", leg)], "percentunit",
                     "Fraction of time one or more kernels ran.", maximum=1), 12, 8)
    b.add(timeseries("Memory controller utilisation", [target(f"gpu_memory_utilization_ratio{{{DEV}}}", leg)],
                     "percentunit", "Fraction of time device memory was read or written.", maximum=1), 12, 8)
    b.add(timeseries("Memory used", [target(f"gpu_memory_used_bytes{{{DEV}}}", leg),
                                     target(f"gpu_memory_total_bytes{{{DEV}}}", leg + " total", ref="B")],
                     "bytes", overrides=[by_regexp(".* total", custom__lineStyle={"fill": "dash", "dash": [10, 10]},
                                                   custom__fillOpacity=0)]), 12, 8)
    b.add(bargauge("Memory used / total",
                   [target(f"gpu_memory_used_bytes{{{DEV}}} / gpu_memory_total_bytes{{{DEV}}}", leg, instant=True)],
                   "percentunit", maximum=1), 12, 8)
    b.add(timeseries("Share of each GPU nobody holds",
                     [target(f"rate(gpu_unallocated_seconds_total{{{DEV}}}[$__rate_interval])"
                             f" / rate(gpu_capacity_seconds_total{{{DEV}}}[$__rate_interval])", leg)],
                     "percentunit", "Unallocated GPU time over the GPU's capacity: time-slicing replicas nobody was "
                                    "given, a GPU with no holder, or a GPU that is down. A MIG instance counts its "
                                    "slices of the GPU; the parent the slices in no instance.", maximum=1), 24, 8)

    b.row("Activity: SM, tensor cores, memory bandwidth (GPM: Hopper and newer)")
    gpm_note = (" NVML GPM, averaged between two samples (--gpm-interval); absent on GPUs before Hopper. In MIG mode "
                "per MIG instance.")
    b.add(timeseries("Graphics engine active vs utilisation",
                     [target(f"gpu_graphics_active_ratio{{{DEV}}}", leg + " engine active"),
                      target(f"gpu_utilization_ratio{{{DEV}}}", leg + " utilisation", ref="B")], "percentunit",
                     "Utilisation counts time any kernel ran; the engine-active ratio is the GPM counterpart."
                     + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("SM active", [target(f"gpu_sm_active_ratio{{{DEV}}}", leg)], "percentunit",
                     "Fraction of time the SMs had work resident, averaged over all SMs: how much of the GPU the "
                     "kernels spread over." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("SM occupancy", [target(f"gpu_sm_occupancy_ratio{{{DEV}}}", leg)], "percentunit",
                     "Resident warps as a fraction of the SMs' maximum." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("Tensor cores active", [target(f"gpu_tensor_active_ratio{{{DEV}}}", leg)], "percentunit",
                     "Fraction of time any tensor-core pipe was active." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("Tensor pipes by kind",
                     [target(f"gpu_tensor_hmma_active_ratio{{{DEV}}}", leg + " HMMA (FP16/BF16)"),
                      target(f"gpu_tensor_imma_active_ratio{{{DEV}}}", leg + " IMMA (INT8)", ref="B"),
                      target(f"gpu_tensor_dfma_active_ratio{{{DEV}}}", leg + " DFMA (FP64)", ref="C")],
                     "percentunit", "Half-precision, integer and double-precision tensor-core pipes." + gpm_note,
                     maximum=1), 8, 8)
    b.add(timeseries("DRAM bandwidth used", [target(f"gpu_dram_active_ratio{{{DEV}}}", leg)], "percentunit",
                     "Device-memory bandwidth used as a fraction of the peak." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("FP pipes (non-tensor)",
                     [target(f"gpu_fp16_active_ratio{{{DEV}}}", leg + " FP16"),
                      target(f"gpu_fp32_active_ratio{{{DEV}}}", leg + " FP32", ref="B"),
                      target(f"gpu_fp64_active_ratio{{{DEV}}}", leg + " FP64", ref="C")],
                     "percentunit", "Fraction of time the SMs' FP16, FP32 and FP64 pipes were active." + gpm_note,
                     maximum=1), 8, 8)
    b.add(timeseries("PCIe traffic (GPM)",
                     [target(f"gpu_gpm_pcie_rx_bytes_per_second{{{DEV}}}", leg + " rx"),
                      target(f"-gpu_gpm_pcie_tx_bytes_per_second{{{DEV}}}", leg + " tx", ref="B")],
                     "Bps", "Receive up, transmit down; averaged over the GPM window." + gpm_note, minimum=None),
          8, 8)
    b.add(timeseries("NVLink traffic",
                     [target(f"gpu_nvlink_rx_bytes_per_second{{{DEV}}}", leg + " rx"),
                      target(f"-gpu_nvlink_tx_bytes_per_second{{{DEV}}}", leg + " tx", ref="B")],
                     "Bps", "All links together; receive up, transmit down. Absent on cards without NVLink."
                     + gpm_note, minimum=None), 8, 8)

    b.row("Power and temperature")
    b.add(timeseries("Power vs limit", [target(f"gpu_power_watts{{{DEV}}}", leg),
                                        target(f"gpu_power_limit_watts{{{DEV}}}", leg + " limit", ref="B")],
                     "watt", overrides=[by_regexp(".* limit", custom__lineStyle={"fill": "dash", "dash": [10, 10]},
                                                  custom__fillOpacity=0)]), 12, 8)
    b.add(bargauge("Energy per GPU (time range)",
                   [target(f"increase(gpu_energy_joules_total{{{DEV}}}[$__range])", leg, instant=True)],
                   "joule", "Energy each GPU used over the dashboard's time range."), 6, 8)
    b.add(timeseries("Energy rate (average power)",
                     [target(f"rate(gpu_energy_joules_total{{{DEV}}}[$__rate_interval])", leg)], "watt",
                     "From the energy counter: the average power between scrapes, not a point sample."), 6, 8)
    b.add(timeseries("GPU temperature", [target(f"gpu_temperature_celsius{{{DEV}}}", leg)], "celsius",
                     thresholds=[("green", None), ("orange", 80), ("red", 90)], minimum=None), 12, 8)
    b.add(timeseries("Memory (HBM) temperature", [target(f"gpu_memory_temperature_celsius{{{DEV}}}", leg)], "celsius",
                     "Absent on consumer NVIDIA cards.", thresholds=[("green", None), ("orange", 85), ("red", 95)],
                     minimum=None), 12, 8)
    b.add(timeseries("Fan speed", [target(f"gpu_fan_speed_ratio{{{DEV}}}", leg)], "percentunit",
                     "Cards with fans only; absent on passively cooled data-centre GPUs.", maximum=1), 12, 6)

    b.row("Clocks and PCIe")
    b.add(timeseries("SM clock", [target(f"gpu_sm_clock_hertz{{{DEV}}}", leg)], "hertz"), 8, 8)
    b.add(timeseries("Memory clock", [target(f"gpu_memory_clock_hertz{{{DEV}}}", leg)], "hertz"), 8, 8)
    b.add(timeseries("PCIe throughput", [target(f"rate(gpu_pcie_rx_bytes_total{{{DEV}}}[$__rate_interval])",
                                                leg + " rx"),
                                         target(f"-rate(gpu_pcie_tx_bytes_total{{{DEV}}}[$__rate_interval])",
                                                leg + " tx", ref="B")],
                     "Bps", "Receive up, transmit down (from the driver's PCIe byte counters).", minimum=None), 8, 8)
    b.add(timeseries("Clock throttle reasons (active)",
                     [target(f"max by (node, gpu, reason) (gpu_clock_throttle_active{{{DEV}}}) > 0",
                             leg + " {{reason}}")], "none",
                     "Reasons holding the clocks down; gpu_idle is normal on an idle GPU. NVIDIA only.",
                     stack=True, draw="bars"), 24, 7)

    b.row("Errors")
    b.add(timeseries("ECC errors (increase)",
                     [target(f"sum by (node, gpu, type) (increase(gpu_ecc_errors_total{{{DEV}}}[$__rate_interval]))",
                             leg + " {{type}}")], "none", "Corrected and uncorrected ECC errors.", draw="bars"), 8, 7)
    b.add(timeseries("XID errors (increase)",
                     [target(f"sum by (node, gpu, xid) (increase(gpu_xid_errors_total{{{DEV}}}[$__rate_interval]))",
                             leg + " xid {{xid}}")], "none", "XID events by code. NVIDIA only.", draw="bars"), 8, 7)
    b.add(timeseries("GPU up", [target(f"gpu_up{{{DEV}}}", leg)], "none", "1 read, 0 failed.", maximum=1,
                     draw="line"), 8, 7)
    b.add(timeseries("Stuck in a driver call", [target(f"gpu_stuck_call_seconds{{{DEV}}}", leg + " {{call}}")], "s",
                     "How long a GPU has not returned from a call into the vendor library (the call is named): the "
                     "GPU is reported down meanwhile and the other GPUs go on (GPUStuckInDriverCall, "
                     "docs/HEALTH.md).", thresholds=[("green", None), ("red", 30)]), 24, 7)

    b.row("Agent health")
    b.add(timeseries("Collector success", [
        target(f"min by (node, collector) (l9gpu_collector_success * {WITH_NODE})", "{{node}} {{collector}}")],
        "none", "1 when the named collector succeeded in the agent's last pass.", maximum=1), 8, 7)
    b.add(timeseries("Collector duration", [
        target(f"max by (node, collector) (l9gpu_collector_duration_seconds * {WITH_NODE})", "{{node}} {{collector}}")],
        "s"), 8, 7)
    b.add(timeseries("Snapshot age", [
        target(f"max by (node) (l9gpu_snapshot_age_seconds * {WITH_NODE})", "{{node}}")], "s",
        "Age of the snapshot served; far above the interval means the collector is stuck.",
        thresholds=[("green", None), ("orange", 30), ("red", 60)]), 8, 7)
    b.add(timeseries("Unattributed GPU processes",
                     [target('l9gpu_unattributed_processes{node=~"$node"}', "{{node}}")], "none",
                     "GPU processes that belong to no pod or Slurm job.", draw="bars"), 8, 7)
    b.add(stat("Host PIDs visible", [target('min(l9gpu_host_pids_visible{node=~"$node"})', instant=True)], "none",
               "0 on a node means the agent cannot see host PIDs: run with hostPID: true or mount the host's /proc "
               "and pass --proc-root.", thresholds=[("red", None), ("green", 1)]), 4, 7)
    b.add(timeseries("Backend errors", [
        target(f"sum by (node, backend, reason) (rate(l9gpu_backend_errors_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{backend}} {{reason}}")], "none", "Errors a device backend survived, per second."), 4, 7)
    b.add(table("Agent versions", [target(f"l9gpu_build_info * {WITH_NODE}", instant=True, table=True)],
                "Version of the agent on each node.", hide=["Value"]), 12, 6)
    b.add(timeseries("OTLP pushes", [
        target(f"sum by (node, result) (rate(l9gpu_otlp_exports_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{result}}")], "none",
        "OTLP pushes per second by result; present only where OTLP push is on.", draw="bars"), 12, 6)
    b.add(timeseries("Connections turned away", [
        target(f"sum by (node, reason) (rate(l9gpu_http_rejections_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{reason}}")], "none",
        "Connections and requests the agent's HTTP listener turned away per second, by reason: its connection "
        "limit, header deadline and size, accept failures (out of file descriptors), and the web config's refusals "
        "(certificate, rate limit, queued password checks, failed logins). Alert L9gpuListenerUnderFlood.",
        draw="bars"), 24, 6)
    return dashboard("l9gpu-devices", "l9gpu / GPU devices",
                     "Per-GPU utilisation, memory, power, energy, temperature, clocks, PCIe, ECC, XID and throttling, "
                     "and the health of the l9gpu agents.", b, [NODE_VAR, GPU_VAR], ["l9gpu", "gpu"])


DASHBOARDS = {"l9gpu-workloads.json": workloads, "l9gpu-devices.json": devices}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name, build in DASHBOARDS.items():
        text = render(build)
        path = HERE / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run python dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
