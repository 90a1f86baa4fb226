"""docs/METRICS.md, generated from the metric table (`exporter.output.catalogue`).

``python -m exporter.output.catalogue > docs/METRICS.md`` writes it; a test fails when the
file and the table disagree. One section per scope (a family of a scope without one is
refused, so none is left out), the DCGM schema's names (`exporter.output.dcgm.fields`), the
agent process's own families, what the GPM families are, what each family means per vendor
(`exporter.output.vendor_notes`) and the OTLP attribute names.
"""

from __future__ import annotations

from exporter.core.labels import (
    DEVICE_LABELS,
    OWNER_LABELS,
    PROCESS_LABELS,
    TRAINING_LABELS,
    WORKLOAD_ID_LABELS,
    WORKLOAD_LABELS,
)
from exporter.output import catalogue as cat
from exporter.output.dcgm import fields as dcgm
from exporter.output.spec import (
    COUNTER,
    DEVICE,
    HEALTH,
    INCIDENT,
    LABEL_ATTRIBUTES,
    PROCESS,
    SELF,
    UNATTRIBUTED,
    WORKLOAD,
    WORKLOAD_GPM,
)
from exporter.output.vendor_notes import NOTES, VENDORS, note

D = DEVICE_LABELS
W = WORKLOAD_LABELS

# docs/METRICS.md: what the GPM families are, where they exist and how they are read.
GPM_DOC: tuple[str, ...] = (
    "## GPM activity: how much of the GPU the kernels use",
    "",
    "`gpu_utilization_ratio` is the fraction of time *any* kernel ran: one tiny kernel keeps it at "
    "100%. The GPM families say how much of the GPU that work used, from NVML's GPU Performance "
    "Monitoring (the counters behind DCGM's `DCGM_FI_PROF_*` profiling fields, without DCGM's host "
    "engine). Checked on an H200 with a bf16 matmul job at a ~60% duty cycle: utilisation 0.65, "
    "graphics active 0.59, SM active 0.55, SM occupancy 0.08, tensor active 0.53, DRAM 0.11.",
    "",
    "- **Which GPUs.** NVIDIA Hopper and newer (H100, H200, H800, GH200, B100, B200, GB200) with a "
    "driver and an nvidia-ml-py that have GPM. On older GPUs (A100, A10, L4, L40, V100, T4, ...) "
    "the families are absent, the reason is logged once at start and `l9gpu snapshot` shows it. "
    "AMD and Gaudi: absent.",
    "- **Window.** Each value is the average between two GPM samples of the device, taken "
    "`--gpm-interval` apart (default 5 s; `0` samples every pass, `off` turns GPM off). The first "
    "value appears one window after start; between samples the last window's values stay.",
    "- **MIG.** In MIG mode each MIG instance (`gpu_instance` label) has its own values; the parent "
    "GPU has none.",
    "- **A metric a device does not report** (NVLink on a card without it) is absent, never 0.",
    "- **Cost.** Only the metrics of exported families are asked. On an H200 a GPM read (the "
    "sample and the metrics) cost about 2.1 ms of CPU a GPU in the agent's passes, nearly all of "
    "it graphics activity; with `gpu_graphics_active_ratio` and "
    "`container_gpu_graphics_active_ratio` disabled (`--disable-metric`), 0.26 ms (see "
    "docs/PERFORMANCE.md).",
    "- **Per workload.** `container_gpu_*` copies of these families exist only on a GPU or MIG "
    "instance whose processes all belong to one workload: GPM counts the whole device and cannot "
    "be split by process, so on a shared (time-sliced) GPU only the device series and each pod's "
    "`container_gpu_utilization_ratio` exist (see docs/ATTRIBUTION.md).",
    "",
)


def _fmt_scale(scale: float) -> str:
    if scale == 1.0:
        return ""
    if scale == 1.0 / 1024:
        return " (÷ 1024, KB)"
    if scale == 1.0 / 2**20:
        return " (÷ 2^20, MiB)"
    if scale == 1.0 / 1024:
        return " (÷ 1024, KB/s)"
    return f" (× {scale:g})"


# docs/METRICS.md's sections, one per scope, in this order. `markdown` refuses a family
# whose scope has none, so no family can be left out of the reference.
SECTIONS: dict[str, str] = {
    DEVICE: "Device",
    HEALTH: "Health (per GPU; a MIG instance has its parent's; see docs/HEALTH.md)",
    WORKLOAD: "Workload",
    WORKLOAD_GPM: "Workload: GPM activity on a GPU or MIG instance used by one workload",
    INCIDENT: "Incidents (per workload and GPU; see docs/INCIDENTS.md)",
    UNATTRIBUTED: "Unattributed (per GPU)",
    PROCESS: "Per process (opt-in: `--process-metrics`)",
    SELF: "Agent self-metrics",
}


def _dcgm_section() -> list[str]:
    """The series `--metric-schema dcgm` serves, from the DCGM field table (exporter/output/dcgm/fields.py)."""
    out = ["## DCGM-compatible names (`--metric-schema dcgm`)", "",
           "Served instead of (or, with `--metric-schema l9gpu,dcgm`, beside) the families above, with "
           "dcgm-exporter's units and labels; the labels, the per-workload series and the fields left out are "
           "in docs/MIGRATING-FROM-DCGM.md.", "",
           "| name | type | unit | from l9gpu |", "|---|---|---|---|"]
    out += [f"| `{field.name}` | {field.type} | {field.unit or '—'} | {field.l9gpu} |"
            for field in dcgm.FIELDS if field.type != "label"]
    return out + [""]


def _runtime_section() -> list[str]:
    """The agent process's own families, from the prometheus_client collectors it registers
    beside its own (exporter/app/wiring.py): CPU, memory and file descriptors, the Python runtime."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    families = sorted(registry.collect(), key=lambda family: family.name)
    out = ["## The agent process (prometheus_client)", "", "| name | type | description |", "|---|---|---|"]
    out += [f"| `{family.name}{'_total' if family.type == COUNTER else ''}` | {family.type} | "
            f"{family.documentation} |" for family in families]
    return out + [""]


# Which scheduler fills the training labels, and how (docs/ATTRIBUTION.md#job-and-rank says
# which keys each is read from, exporter/attribution/training.py reads them).
_TRAINING_SOURCES: tuple[tuple[str, str, str], ...] = (
    ("Kubeflow Trainer v2 (TrainJob)", "the TrainJob", "JobSet's: `node-0-3`"),
    ("Kubeflow training-operator (PyTorchJob, TFJob, MPIJob, ...)", "the job", "replica type and index: `worker-3`"),
    ("JobSet", "the JobSet", "replicated job, job index, completion index: `workers-1-0`"),
    ("Volcano Job", "the job", "task and task index: `worker-3`"),
    ("LeaderWorkerSet", "the LeaderWorkerSet", "group index and worker index: `2-1`"),
    ("KubeRay (RayCluster, RayJob)", "the Ray cluster", "none (Ray ranks its workers itself)"),
    ("Indexed Job", "the Job", "completion index: `3`"),
    ("Slurm", "the job id", "the task's `SLURM_PROCID`: `13`"),
)


def _training_labels() -> list[str]:
    """The paragraph and table on ``training_job`` and ``training_rank``."""
    out = [
        "Workload and per-process series of a pod (or Slurm process) that is a rank of a distributed training job "
        "also carry `" + "` and `".join(TRAINING_LABELS) + "`: the job as its scheduler names it, and the rank "
        "written as the scheduler names the pod after the job's name. A workload of no job carries neither (the "
        "labels are absent, not empty). They are not called `job`: that is Prometheus' own target label (with "
        "`honor_labels: true` the agent's value would replace the scrape job's name; without it Prometheus "
        "renames it `exported_job`). How each is read: [docs/ATTRIBUTION.md](ATTRIBUTION.md#job-and-rank).",
        "",
        "| scheduler | `training_job` | `training_rank` |",
        "|---|---|---|",
    ]
    out += [f"| {who} | {job} | {rank} |" for who, job, rank in _TRAINING_SOURCES]
    return out + [""]


def markdown() -> str:
    """Render the catalogue as docs/METRICS.md."""
    out = [
        "# Metrics",
        "",
        "Generated from `exporter/output/catalogue.py` by `python -m exporter.output.catalogue > docs/METRICS.md`;",
        "do not edit by hand (a test fails when this file and the catalogue disagree).",
        "",
        "Every GPU series carries `" + "`, `".join(DEVICE_LABELS) + "`; workload series add `"
        + "`, `".join(WORKLOAD_ID_LABELS) + "` (empty where not applicable), plus `"
        + "`, `".join(OWNER_LABELS[:-1]) + "`, `" + OWNER_LABELS[-1] + "` and `label_<key>` when configured. Values a "
        "device cannot provide are omitted, never exported as 0.",
        "",
    ] + _training_labels()
    untitled = sorted({spec.scope for spec in cat.METRICS} - set(SECTIONS))
    if untitled:  # every family is listed: a new scope needs its section
        raise ValueError(f"docs/METRICS.md has no section for the families of scope {untitled}")
    for scope, title in SECTIONS.items():
        out += [f"## {title}", "", "| name | type | unit (OTLP) | labels | description | DCGM exporter equivalent |",
                "|---|---|---|---|---|---|"]
        for spec in cat.METRICS:
            if spec.scope != scope:
                continue
            base = {DEVICE: D, HEALTH: D, WORKLOAD: W, WORKLOAD_GPM: W, INCIDENT: W,
                    PROCESS: PROCESS_LABELS}.get(scope, ())
            extra = spec.labels[len(base):] if base and spec.labels[: len(base)] == base else spec.labels
            labels = {DEVICE: "device", HEALTH: "device", WORKLOAD: "workload", WORKLOAD_GPM: "workload",
                      INCIDENT: "workload", PROCESS: "workload"}.get(scope, "")
            label_text = ", ".join(filter(None, [f"*{labels}*" if labels else ""] + [f"`{x}`" for x in extra]))
            dcgm = f"`{spec.dcgm[0]}`{_fmt_scale(spec.dcgm[1])}" if spec.dcgm[0] else ""
            help_text = spec.help + (f" Note: {spec.vendors_note}." if spec.vendors_note else "")
            out.append(f"| `{spec.name}` | {spec.type} | {spec.ucum} | {label_text} | {help_text} | {dcgm} |")
        out.append("")
    out += _dcgm_section() + _runtime_section()
    out += list(GPM_DOC)
    out += ["## Per vendor", "", "What each family means on each backend; \u2014 where the vendor cannot provide it "
            "(the series is absent, never 0).", "", "| family | " + " | ".join(VENDORS.values()) + " |",
            "|---|" + "---|" * len(VENDORS)]
    out += [f"| `{name}` | " + " | ".join(note(name, vendor) for vendor in VENDORS) + " |" for name in NOTES]
    out += [""]
    out += ["## OTLP attribute names", "", "| Prometheus label | OTLP attribute |", "|---|---|"]
    out += [f"| `{k}` | `{v}` |" for k, v in LABEL_ATTRIBUTES.items()]
    out += ["| `label_<key>` | `k8s.pod.label.<key>` |", ""]
    return "\n".join(out)
