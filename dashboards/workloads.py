"""The workloads dashboard (l9gpu-workloads.json): GPU memory, compute, idle holders,
chargeback, cost and inference per namespace, pod, container and Slurm job.

Each row is one function that adds its title and panels to the board; ROWS lists them in the
order they appear, so a new row is a function and one entry there.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from dashboards.panels import (
    DASHED,
    DEV,
    GPU_VAR,
    NAMESPACE_VAR,
    NODE_VAR,
    POD,
    WL,
    Board,
    bargauge,
    by_name,
    by_regexp,
    colour_cells,
    dashboard,
    fixed_colour,
    stat,
    table,
    target,
    thresholds,
    timeseries,
)

BARS = common.GraphDrawStyle.BARS
UNSTACKED = common.StackingConfig(mode=common.StackingMode.NONE, group="A")
# Inference rules per workload (alerts/l9gpu-inference.rules.yaml).
P_ALLOC = "namespace_pod:container_gpu_allocation_seconds:rate5m"
P_TOKENS = "namespace_pod:l9gpu_inference_tokens:rate5m"
# Workloads in a namespace (chargeback and cost leave out processes of no namespace: Slurm, host).
CB = WL + ', namespace!=""'
SLURM = 'node=~"$node", gpu=~"$gpu", slurm_job_id!=""'
MONEY = "In the prices file's currency (`l9gpu prices FILE` loads it into Prometheus; docs/CHARGEBACK.md)."


def _overview(b: Board) -> None:
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
               steps=[("green", None), ("orange", 1)]), 4, 4)
    b.add(stat("Unattributed GPU memory",
               [target(f"sum(gpu_unattributed_memory_used_bytes{{{DEV}}})", instant=True)], "bytes",
               "Memory held by processes that belong to no pod or Slurm job (host processes, or PIDs the "
               "agent cannot see).", steps=[("green", None), ("orange", 1)]), 4, 4)
    b.add(stat("Attributed power",
               [target(f"sum(rate(container_gpu_energy_joules_total{{{WL}}}[$__rate_interval]))", instant=True)],
               "watt", "Power drawn on behalf of workloads (busy energy by SM share, idle energy by memory share)."),
          4, 4)


def _workloads(b: Board) -> None:
    b.row("Workloads")
    b.add(timeseries("GPU memory by pod",
                     [target(f"sum by (namespace, pod, container) (container_gpu_memory_used_bytes{{{POD}}})",
                             "{{namespace}}/{{pod}}/{{container}}")],
                     "bytes", "Device memory held by each container's processes, summed over its GPUs.", stack=True),
          12, 9)
    b.add(timeseries("SM share by pod and GPU",
                     [target(f"rate(container_gpu_usage_seconds_total{{{POD}}}[$__rate_interval])",
                             "{{namespace}}/{{pod}}/{{container}} gpu {{gpu}}")],
                     "percentunit", "Each container's share of a GPU's SM time, averaged over the rate interval "
                     "(the rate of its GPU-seconds of compute; the last pass's share, "
                     "container_gpu_utilization_ratio, is served with --detail).",
                     maximum=1), 12, 9)
    b.add(timeseries("GPUs of compute by namespace",
                     [target(f"sum by (namespace) (rate(container_gpu_usage_seconds_total{{{WL}, namespace!=\"\"}}"
                             "[$__rate_interval]))",
                             "{{namespace}}")],
                     "none", "GPU-seconds of compute per second (1.0 = one GPU fully busy); "
                             "`namespace:container_gpu_usage_seconds:rate5m` records the same over 5m.",
                     stack=True), 12, 8)



def _idle_holders(b: Board) -> None:
    b.row("Idle holders (zombies)")
    zombie = f"container_gpu_idle_seconds{{{WL}}} > 0"
    b.add(table("Holding GPU memory without computing", [
        target(f"sort_desc({zombie})", ref="A", instant=True, table=True),
        target(f"container_gpu_memory_used_bytes{{{WL}}} and ({zombie})", ref="B", instant=True, table=True),
    ], "Workloads that hold GPU memory and have run no kernel for the time shown, longest first. "
       "Over an hour this fires GPUZombieWorkload.",
        rename={"Value #A": "idle for", "Value #B": "memory held"}, sort="idle for", overrides=[
            by_name("idle for", unit="s",
                    thresholds=thresholds([("green", None), ("orange", 600), ("red", 3600)]).build(),
                    custom__cellOptions=colour_cells()),
            by_name("memory held", unit="bytes"),
        ]), 24, 8)

    unused = f"(container_gpu_allocated{{{WL}}} == 1 and container_gpu_memory_used_bytes{{{WL}}} == 0)"
    b.add(table("GPUs allocated but unused", [
        target(f"sort_desc(container_gpu_idle_seconds{{{WL}}} and {unused})", ref="A", instant=True, table=True),
    ], "Containers the device plugin gave a GPU (kubelet pod-resources) that run no process on it, longest "
       "first: the whole GPU is reserved and does nothing. Over an hour this fires GPUAllocatedButUnused.",
        rename={"Value #A": "allocated and unused for"}, sort="allocated and unused for", overrides=[
            by_name("allocated and unused for", unit="s",
                    thresholds=thresholds([("green", None), ("orange", 600), ("red", 3600)]).build(),
                    custom__cellOptions=colour_cells()),
        ]), 24, 6)


def _tensor_cores(b: Board) -> None:
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


def _chargeback(b: Board) -> None:
    b.row("Chargeback (selected time range)")
    b.add(table("Per namespace", [
        target(f"sum by (namespace) (increase(container_gpu_usage_seconds_total{{{CB}}}[$__range])) / 3600",
               ref="A", instant=True, table=True),
        target(f"sum by (namespace) (increase(container_gpu_allocation_seconds_total{{{CB}}}[$__range])) / 3600",
               ref="B", instant=True, table=True),
        target(f"sum by (namespace) (increase(container_gpu_energy_joules_total{{{CB}}}[$__range])) / 3.6e6",
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
        target(f"sort_desc(sum by (namespace) (increase(container_gpu_usage_seconds_total{{{CB}}}[$__range])) / 3600)",
               "{{namespace}}", instant=True)], "h"), 6, 9)
    b.add(bargauge("Energy by namespace", [
        target(f"sort_desc(sum by (namespace) (increase(container_gpu_energy_joules_total{{{CB}}}[$__range])) / 3.6e6)",
               "{{namespace}}", instant=True)], "kwatth"), 6, 9)
    b.add(timeseries("Attributed power by namespace",
                     [target(f"sum by (namespace) (rate(container_gpu_energy_joules_total{{{WL}}}[$__rate_interval]))",
                             "{{namespace}}"),
                      target(f"sum(rate(gpu_unattributed_energy_joules_total{{{DEV}}}[$__rate_interval]))",
                             "unattributed / idle", ref="B")],
                     "watt", "Workload energy plus unattributed energy adds up to the GPUs' energy.", stack=True),
          24, 8)


def _cost(b: Board) -> None:
    b.row("Cost (selected time range)")
    # Prices come from `l9gpu prices FILE` (recording rules); the chargeback rules record the
    # price per namespace and model while it is in use, so a namespace gone before the end of
    # the range keeps its price through last_over_time.
    price = "last_over_time(namespace_model:l9gpu_gpu_hour_price[$__range])"
    kwh = "last_over_time(namespace:l9gpu_kwh_price[$__range])"

    def cost(counter: str) -> str:
        return (f"sum by (namespace) (increase({counter}{{{CB}}}[$__range])"
                f" * on (namespace, model) group_left () {price}) / 3600")

    allocated = cost("container_gpu_allocation_seconds_total")
    effective = cost("container_gpu_usage_seconds_total")
    energy = (f"sum by (namespace) (increase(container_gpu_energy_joules_total{{{CB}}}[$__range]))"
              f" * on (namespace) {kwh} / 3.6e6")
    waste = f"({allocated}) - ({effective} or {allocated} * 0)"
    waste_ratio = (f"1 - (sum by (namespace) (increase(container_gpu_usage_seconds_total{{{CB}}}[$__range]))"
                   f" / sum by (namespace) (increase(container_gpu_allocation_seconds_total{{{CB}}}[$__range])))")
    b.add(stat("Allocated cost", [target(f"sum({allocated})", instant=True)], "none",
               "GPU-hours held (allocated, or holding memory) x price per GPU-hour. " + MONEY, decimals=2), 5, 4)
    b.add(stat("Effective cost", [target(f"sum({effective})", instant=True)], "none",
               "GPU-hours of compute (SM time) x price per GPU-hour. " + MONEY, decimals=2), 5, 4)
    b.add(stat("Waste", [target(f"sum({allocated}) - sum({effective})", instant=True)], "none",
               "Allocated minus effective cost: GPU time paid for and not computed with. " + MONEY, decimals=2,
               steps=[("green", None), ("orange", 1)]), 5, 4)
    b.add(stat("Waste ratio",
               [target(f"1 - sum(increase(container_gpu_usage_seconds_total{{{CB}}}[$__range]))"
                       f" / sum(increase(container_gpu_allocation_seconds_total{{{CB}}}[$__range]))", instant=True)],
               "percentunit", "Share of allocated GPU time not used for compute.", decimals=1,
               steps=[("green", None), ("orange", 0.3), ("red", 0.6)]), 4, 4)
    b.add(stat("Energy cost", [target(f"sum({energy})", instant=True)], "none",
               "Attributed energy x price per kWh. " + MONEY, decimals=2), 5, 4)
    # What the GPUs cost, held or not: capacity (GPU-seconds offered) x the model's price.
    model_price = "last_over_time(model:l9gpu_gpu_hour_price[$__range])"

    def gpu_cost(counter: str) -> str:
        return (f"sum(sum by (model) (increase({counter}{{{DEV}}}[$__range]))"
                f" * on (model) group_left () {model_price}) / 3600")

    b.add(stat("GPU cost", [target(gpu_cost("gpu_capacity_seconds_total"), instant=True)], "none",
               "What the GPUs cost over the range, held or not: their GPU-hours x each model's price. The "
               "namespaces' allocated cost, the Slurm jobs', the unallocated cost and the price overrides add up "
               "to it (a shared GPU's hour is paid once). " + MONEY, decimals=2), 12, 4)
    b.add(stat("Unallocated cost", [target(gpu_cost("gpu_unallocated_seconds_total"), instant=True)], "none",
               "GPU time no workload held (time-slicing replicas nobody was given, idle GPUs, GPUs down) x price: "
               "what the platform pays for itself. " + MONEY, decimals=2,
               steps=[("green", None), ("orange", 1)]), 12, 4)
    b.add(table("Cost per namespace", [
        target(allocated, ref="A", instant=True, table=True),
        target(effective, ref="B", instant=True, table=True),
        target(waste, ref="C", instant=True, table=True),
        target(waste_ratio, ref="D", instant=True, table=True),
        target(energy, ref="E", instant=True, table=True),
    ], "Allocated cost (GPU-hours held x price), effective cost (GPU-hours of compute x price), their difference "
       "(waste), the share of allocated time wasted, and energy cost, over the dashboard's time range. "
       "`l9gpu report` gives the same per pod label or Slurm account, as CSV, JSON or HTML. " + MONEY,
        rename={"Value #A": "allocated cost", "Value #B": "effective cost", "Value #C": "waste",
                "Value #D": "waste ratio", "Value #E": "energy cost"}, sort="allocated cost", overrides=[
            by_name("allocated cost", decimals=2), by_name("effective cost", decimals=2),
            by_name("waste", decimals=2), by_name("energy cost", decimals=2),
            by_name("waste ratio", unit="percentunit", decimals=1,
                    thresholds=thresholds([("green", None), ("orange", 0.3), ("red", 0.6)]).build(),
                    custom__cellOptions=colour_cells()),
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
                             + MONEY, stack=True), 12, 8)
    b.add(timeseries("Waste per hour by namespace",
                     [target('namespace:l9gpu_allocated_cost_per_hour:rate5m{namespace=~"$namespace"}'
                             ' - (namespace:l9gpu_effective_cost_per_hour:rate5m{namespace=~"$namespace"}'
                             ' or namespace:l9gpu_allocated_cost_per_hour:rate5m{namespace=~"$namespace"} * 0)',
                             "{{namespace}}")],
                     "none", "Allocated minus effective cost per hour: held GPU time not computed with. " + MONEY,
                     stack=True), 12, 8)


def _carbon(b: Board) -> None:
    b.row("Carbon (GPU energy x grid intensity)")
    intensity = "scalar(l9gpu_carbon_gco2e_per_kwh)"
    carbon_note = ("GPU board energy only (the workloads' shares of each GPU's energy), times the grid carbon "
                   "intensity `l9gpu prices FILE` loads from the prices file's carbon section (its PUE included); "
                   "not the hosts, cooling or the building. `l9gpu report` integrates an intensity that varies "
                   "over time step by step (docs/CHARGEBACK.md).")
    b.add(stat("Carbon",
               [target(f"sum(increase(container_gpu_energy_joules_total{{{CB}}}[$__range])) / 3.6e6 * {intensity}"
                       " / 1000", instant=True)],
               "masskg", "kg CO2e over the dashboard's time range. " + carbon_note, decimals=2), 6, 8)
    b.add(timeseries("Carbon per hour by namespace",
                     [target(f"sum by (namespace) (rate(container_gpu_energy_joules_total{{{CB}}}"
                             f"[$__rate_interval])) * 3600 / 3.6e6 * {intensity}", "{{namespace}}")],
                     "massg", "Grams of CO2e per hour on behalf of each namespace. " + carbon_note, stack=True), 18, 8)


def _memory_growth(b: Board) -> None:
    b.row("Memory growth")
    b.add(timeseries("GPU memory in one hour, as a share of the GPU (linear forecast)",
                     [target(f"predict_linear(container_gpu_memory_used_bytes{{{POD}}}[30m], 3600)"
                             " / on (node, uuid, gpu_instance) group_left ()"
                             f" gpu_memory_total_bytes{{{DEV}}}",
                             "{{namespace}}/{{pod}}/{{container}} gpu {{gpu}}")],
                     "percentunit", "predict_linear over 30 minutes, one hour ahead. Above 100% the container is on "
                                    "course to run out of GPU memory (GPUMemoryGrowthToOOM).",
                     steps=[("green", None), ("orange", 0.9), ("red", 1)]), 24, 8)

    b.add(timeseries("Time until GPU memory is full (autoscaler input)",
                     [target('namespace_pod:l9gpu_gpu_memory_full_in_seconds:deriv30m{namespace=~"$namespace"}',
                             "{{namespace}}/{{pod}}")],
                     "s", "Free memory of each workload's GPUs over its own growth in the last 30 minutes, the soonest "
                          "of its GPUs (recorded by l9gpu.rules.yaml for KEDA's Prometheus scaler or an HPA through "
                          "prometheus-adapter). Only workloads whose GPU memory grows appear: inference engines "
                          "preallocate theirs, watch their KV cache below instead.",
                     steps=[("red", None), ("orange", 3600), ("green", 6 * 3600)]), 24, 7)


def _inference(b: Board) -> None:
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
                             "dearer." + inference_note + " " + MONEY,
                     overrides=[by_regexp(".* \\(used\\)", custom__lineStyle=DASHED)]),
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
                     steps=[("green", None), ("orange", 0.8), ("red", 0.9)]), 12, 8)
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


def _who_is_on_each_gpu(b: Board) -> None:
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
        by_name("total", custom__stacking=UNSTACKED, custom__fillOpacity=0,
                custom__lineStyle=DASHED, color=fixed_colour("red")),
        by_name("unattributed", color=fixed_colour("gray")),
    ]), 12, 8)
    who.repeat("gpu").repeat_direction("h").max_per_row(2)


def _slurm_jobs(b: Board) -> None:
    b.row("Slurm jobs")
    b.add(table("Slurm jobs on GPUs", [
        target(f"sum by (slurm_job_id, node, gpu) (container_gpu_memory_used_bytes{{{SLURM}}})", ref="A", instant=True,
               table=True),
        target(f"sum by (slurm_job_id, node, gpu) (rate(container_gpu_usage_seconds_total{{{SLURM}}}"
               "[$__rate_interval]))", ref="B", instant=True, table=True),
        target(f"sum by (slurm_job_id, node, gpu) (increase(container_gpu_usage_seconds_total{{{SLURM}}}[$__range]))"
               " / 3600",
               ref="C", instant=True, table=True),
        target(f"sum by (slurm_job_id, node, gpu) (increase(container_gpu_energy_joules_total{{{SLURM}}}[$__range]))"
               " / 3.6e6",
               ref="D", instant=True, table=True),
    ], "Slurm jobs holding GPUs on the selected nodes (processes in a slurmstepd cgroup).",
        rename={"Value #A": "memory", "Value #B": "SM share", "Value #C": "GPU-hours (compute)", "Value #D": "energy"},
        sort="memory", overrides=[
            by_name("memory", unit="bytes"), by_name("SM share", unit="percentunit"),
            by_name("GPU-hours (compute)", unit="h", decimals=2), by_name("energy", unit="kwatth", decimals=3),
        ]), 12, 8)
    b.add(timeseries("GPUs of compute by Slurm job", [
        target(f"sum by (slurm_job_id) (rate(container_gpu_usage_seconds_total{{{SLURM}}}[$__rate_interval]))",
               "job {{slurm_job_id}}")], "none", "GPU-seconds of compute per second for each Slurm job.", stack=True),
        12, 8)



def _detail(b: Board) -> None:
    """What the agent serves only with --detail (or --enable-metric): the last pass's SM share
    and the process count of each workload (docs/METRICS.md, *Series per GPU*)."""
    b.row("Detail (served with --detail)")
    b.add(timeseries("GPU processes by pod",
                     [target(f"sum by (namespace, pod) (container_gpu_processes{{{POD}}})", "{{namespace}}/{{pod}}")],
                     "none", "GPU processes of each pod on the selected GPUs. Served with --detail.", stack=True,
                     draw=BARS), 12, 8)
    b.add(timeseries("SM share by pod and GPU, last pass",
                     [target(f"container_gpu_utilization_ratio{{{POD}}}",
                             "{{namespace}}/{{pod}}/{{container}} gpu {{gpu}}")],
                     "percentunit", "Each container's share of a GPU's SM time over the agent's last interval. "
                     "Served with --detail.", maximum=1), 12, 8)


ROWS = [_overview, _workloads, _idle_holders, _tensor_cores, _chargeback, _cost, _carbon, _memory_growth, _inference,
        _who_is_on_each_gpu, _slurm_jobs, _detail]


def workloads() -> model.Dashboard:
    return dashboard("l9gpu-workloads", "l9gpu / GPU workloads",
                     "GPU memory, compute, idle holders and chargeback per namespace, pod, container and Slurm job.",
                     ["l9gpu", "gpu", "kubernetes"], [NODE_VAR, NAMESPACE_VAR, GPU_VAR], ROWS)
