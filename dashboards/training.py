"""The training jobs dashboard (l9gpu-training.json): jobs across nodes, from the rules of
alerts/l9gpu-training.rules.yaml (docs/TRAINING.md, "Across nodes").

Jobs with their GPUs, stalled share, suspects, stragglers and hardware utilisation; one job's
ranks over time (tensor activity, SM clock, power, stalled); the alerts link here with the
job selected (``var-namespace``, ``var-job``).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as sdk_common
from grafana_foundation_sdk.builders import dashboard as sdk
from grafana_foundation_sdk.builders import statushistory as sdk_statushistory
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from dashboards.panels import (
    DS,
    Board,
    colour_cells,
    dashboard,
    stat,
    table,
    target,
    timeseries,
    variable,
)

UID = "l9gpu-training"
JOB = 'namespace=~"$namespace", training_job=~"$job"'
MEMBER = f"job_rank_gpu:l9gpu_training_stalled:max{{{JOB}}}"


def per_rank(family: str) -> str:
    """A device family per rank of the selected jobs: the GPU's series with the rank's labels."""
    return (f"max by (namespace, training_job, training_rank) ({family} * on (node, gpu) group_left "
            f"(namespace, training_job, training_rank) (0 * {MEMBER} + 1))")


def ranks_history(title: str, expr: str, unit: str, description: str, maximum: float | None = None
                  ) -> sdk_statushistory.Panel:
    """One line per rank, coloured by its value over time (a heatmap of the job's ranks)."""
    panel = (sdk_statushistory.Panel().title(title).description(description).datasource(DS)
             .with_target(target(expr, "{{training_job}} rank {{training_rank}}")).unit(unit).min(0)
             .color_scheme(sdk.FieldColor().mode(model.FieldColorModeId.CONTINUOUS_GR_YL_RD))
             .row_height(0.9).show_value(common.VisibilityMode.NEVER).col_width(0.95).line_width(0)
             .legend(sdk_common.VizLegendOptions().show_legend(False).display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM))
             .tooltip(sdk_common.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE)
                      .sort(common.SortOrder.NONE))
             .overrides([]))
    if maximum is not None:
        panel.max(maximum)
    return panel


def _jobs(b: Board) -> None:
    b.row("Jobs")
    b.add(stat("Training jobs", [target(f"count(job:l9gpu_training_gpus:count{{{JOB}}})", instant=True)], "none",
               "Jobs whose ranks hold GPUs now (workloads with a training_job label)."), 4, 4)
    b.add(stat("GPUs in training jobs", [target(f"sum(job:l9gpu_training_gpus:count{{{JOB}}})", instant=True)],
               "none", "GPUs the ranks of those jobs hold."), 4, 4)
    b.add(stat("Hung jobs", [target(f"count(job:l9gpu_training_hung:ratio{{{JOB}}}) or vector(0)", instant=True)],
               "none", "Jobs with at least half of their GPUs stalled (L9gpuTrainingJobHung).",
               steps=[("green", None), ("red", 1)]), 4, 4)
    b.add(stat("Stalled GPUs",
               [target(f"sum(job:l9gpu_training_gpus_stalled:count{{{JOB}}})", instant=True)], "none",
               "GPUs of training jobs busy with no work (each after the agent's --stall-after).",
               steps=[("green", None), ("orange", 1)]), 4, 4)
    b.add(stat("Hardware stragglers",
               [target(f"count(count by (namespace, training_job, training_rank) "
                       f"(job_rank_gpu:l9gpu_training_straggler:reason{{{JOB}}})) or vector(0)", instant=True)],
               "none", "Ranks slower in hardware than their job's median (L9gpuTrainingJobStraggler).",
               steps=[("green", None), ("orange", 1)]), 4, 4)
    b.add(stat("Hardware utilisation",
               [target(f"sum(job:l9gpu_training_hw_utilization:ratio{{{JOB}}} * on (namespace, training_job) "
                       f"job:l9gpu_training_gpus:count) / sum(job:l9gpu_training_gpus:count{{{JOB}}} and on "
                       f"(namespace, training_job) job:l9gpu_training_hw_utilization:ratio)", instant=True)],
               "percentunit", "Tensor-core activity weighted by the SM clock over its model's maximum, over the "
               "GPUs of the selected jobs (GPM, Hopper and newer). Not MFU: MFU counts only the model's FLOPs and "
               "is at most this.", decimals=1), 4, 4)
    b.add(table("Jobs, their GPUs and what they get from them", [
        target(f"job:l9gpu_training_gpus:count{{{JOB}}}", ref="A", instant=True, table=True),
        target(f"job:l9gpu_training_ranks:count{{{JOB}}}", ref="B", instant=True, table=True),
        target(f"job:l9gpu_training_gpus_stalled:ratio{{{JOB}}}", ref="C", instant=True, table=True),
        target(f"job:l9gpu_training_hw_utilization:ratio{{{JOB}}}", ref="D", instant=True, table=True),
        target(f"count by (namespace, training_job) (job_rank_gpu:l9gpu_training_suspect:info{{{JOB}}})",
               ref="E", instant=True, table=True),
        target(f"count by (namespace, training_job) (job_rank_gpu:l9gpu_training_straggler:reason{{{JOB}}})",
               ref="F", instant=True, table=True),
    ], "One row per job (namespace and job name). Pick a job in the variable at the top to see its ranks below.",
        rename={"training_job": "job", "Value #A": "GPUs", "Value #B": "ranks", "Value #C": "stalled share",
                "Value #D": "hardware utilisation", "Value #E": "suspects", "Value #F": "stragglers"},
        sort="Value #C", overrides=[
            ("byName", "Value #C", [model.DynamicConfigValue(id_val="unit", value="percentunit"),
                                    model.DynamicConfigValue(id_val="custom.cellOptions", value=colour_cells()),
                                    model.DynamicConfigValue(id_val="thresholds", value=model.ThresholdsConfig(
                                        mode=model.ThresholdsMode.ABSOLUTE,
                                        steps=[model.Threshold(color="green", value=None),
                                               model.Threshold(color="red", value=0.5)]))]),
            ("byName", "Value #D", [model.DynamicConfigValue(id_val="unit", value="percentunit")]),
        ]), 24, 9)
    b.add(timeseries("Stalled share per job", [target(f"job:l9gpu_training_gpus_stalled:ratio{{{JOB}}}",
                                                      "{{namespace}}/{{training_job}}")], "percentunit",
                     "The share of each job's GPUs busy with no work; at 50% or more the job is hung.",
                     maximum=1, steps=[("green", None), ("red", 0.5)]), 12, 8)
    b.add(timeseries("Hardware utilisation per job", [target(f"job:l9gpu_training_hw_utilization:ratio{{{JOB}}}",
                                                             "{{namespace}}/{{training_job}}")], "percentunit",
                     "Tensor-core activity x SM clock over its model's maximum, mean over the job's GPUs.",
                     maximum=1), 12, 8)


def _suspects(b: Board) -> None:
    b.row("Hung jobs: suspects, and hardware stragglers")
    b.add(table("Suspects of hung jobs", [
        target(f"job_rank_gpu:l9gpu_training_suspect:info{{{JOB}}}", instant=True, table=True)],
        "Ranks of a hung job that are not like the rest: not stalled while the others are, pod vanished, "
        "Xid or GPU down in the last 15 minutes, or an incident the agent recorded (reason).",
        hide=["Value"], rename={"training_job": "job", "training_rank": "rank"}), 12, 8)
    b.add(table("Hardware stragglers", [
        target(f"job_rank_gpu:l9gpu_training_straggler:reason{{{JOB}}}", instant=True, table=True)],
        "GPUs slower in hardware than their job's median over 10 minutes: sm_clock (clock over the median), "
        "throttle_<reason> (share of the time held), pcie_link (width x generation over the maximum), "
        "pcie_replays and nvlink_errors (per second), temperature (degrees over the median).",
        rename={"training_job": "job", "training_rank": "rank", "Value": "value"}), 12, 8)


def _ranks(b: Board) -> None:
    b.row("The selected job's ranks")
    b.add(ranks_history("Stalled, per rank", MEMBER, "none",
                        "1 (red) while the agent calls the rank's GPU busy with no work.", maximum=1), 12, 10)
    b.add(ranks_history("Tensor-core activity, per rank", per_rank("gpu_tensor_active_ratio"),
                        "percentunit", "GPM tensor activity of each rank's GPU: a wedge is a column of zeros, a "
                        "straggler a rank unlike the others.", maximum=1), 12, 10)
    b.add(ranks_history("SM clock, per rank", per_rank("gpu_sm_clock_hertz"), "hertz",
                        "A rank whose clock stays under the others' computes slower, and every rank waits for it."),
          12, 10)
    b.add(ranks_history("Power, per rank", per_rank("gpu_power_watts"), "watt",
                        "Board power of each rank's GPU: a wedged GPU draws little at full clocks."), 12, 10)


def training() -> model.Dashboard:
    return dashboard(UID, "l9gpu / Training jobs",
                     "Training jobs across nodes: hung jobs and their suspects, hardware stragglers, and what each "
                     "job gets from its GPUs (alerts/l9gpu-training.rules.yaml, docs/TRAINING.md).",
                     ["l9gpu", "gpu", "training"],
                     [variable("namespace", "Namespace",
                               "label_values(job:l9gpu_training_gpus:count, namespace)"),
                      variable("job", "Job",
                               'label_values(job:l9gpu_training_gpus:count{namespace=~"$namespace"}, training_job)')],
                     [_jobs, _suspects, _ranks])
