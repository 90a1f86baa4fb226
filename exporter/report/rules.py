"""The chargeback recording rules (alerts/l9gpu-chargeback.rules.yaml) and how the report reads them.

For a long period on a large fleet, recording rules turn the report's month over every
container into a month over a few series per team: every hour, per namespace and GPU
model, the GPU-seconds allocated, used and held idle and the joules the workloads' counters
rose by in that hour; per GPU model, the GPU-seconds that existed, that nobody held and
that were unhealthy. Each hour's figure is the report's exact rule at a one-hour step
(the difference of each series' last samples in the hour and the hour before, a new
series from 0), and ``increase()`` for a series that fell in the hour (an agent restart):
one sample per group and hour, which survives downsampling (Thanos keeps its sum per
hour, VictoriaMetrics its last sample per hour) and costs a month's report a few thousand
samples.

What the report reads from them, and what they cannot say (`error bound`): the hours
straddling START and END belong partly to the periods before and after; a series that
fell in an hour counts what ``increase()`` extrapolates; an hour the rule evaluator missed
(Prometheus down) is missing (``l9gpu:chargeback_rules:evaluations`` counts the hours
evaluated). Run ``python -m exporter.report.rules`` to print the file (``make docs``).

Per served model (``--by model``), a second group does the report's split of each pod's GPU
time between the models it serves, hour by hour, in three stages of one group (Prometheus
evaluates a group's rules in order, each seeing the ones before at the same time):

1. per pod (namespace, pod, GPU model): what each workload counter rose by in the hour,
   the same rule; per pod and served model the prompt and generated tokens, from the
   built-in engines' counters (the first engine a pod exposes wins, as in the report);
   per pod the seconds in `compute.IDLE_RESOLUTION_S` intervals in which it held GPUs
   and served no token (`compute.idle_expression`, an hour at a time instead of the
   report's month at once);
2. per pod and served model: the model's share of the pod's tokens in the hour (equal
   shares where it served none);
3. per namespace, served model and GPU model: each pod's hour split by those shares, pods
   serving no model in `summary.NONE_GROUP`; per served model the tokens, the idle
   replica-seconds and the replicas serving in the hour.

A pod whose GPUs are of several models and which serves several models cannot be split
in PromQL (a many-to-many match): its hours are in `UNSPLIT_GROUP`. Each stage reads the
records of the stages before, so ``promtool tsdb create-blocks-from rules`` (which lets
no rule see another's results) evaluates them in three passes: ``--stage 1``, then 2,
then 3 (`rules_yaml`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any, Sequence

from exporter.inference.engines import Engine, load_engines
from exporter.inference.rules import union
from exporter.report.compute import IDLE_RESOLUTION_S, TOKEN_FIELDS, idle_expression, token_candidates
from exporter.report.summary import JOB_BY, MODEL_BY, NONE_GROUP

INTERVAL_S = 3600
GROUP = "l9gpu-chargeback-hourly"
JOB_GROUP = "l9gpu-chargeback-jobs-hourly"
JOB = ("namespace", "training_job", "model")
EVALUATIONS = "l9gpu:chargeback_rules:evaluations"
MODEL_GROUP = "l9gpu-chargeback-models-hourly"
MODEL_EVALUATIONS = "l9gpu:chargeback_model_rules:evaluations"
UNSPLIT_GROUP = "(unsplit)"  # pods on several GPU models serving several models (module doc)
POD = ("namespace", "pod", "model")
SPLIT = ("namespace", "model_name", "model")


def hourly_increase(c: str) -> str:
    """What counter ``c`` rose by in the hour before the evaluation, per series: the
    difference of its last samples in this hour and the last, a new series from 0, and
    ``increase()`` where it fell in the two hours (the report's rule at a one-hour step)."""
    return (f"(\n"
            f"  (last_over_time({c}[1h]) - last_over_time({c}[1h] offset 1h))\n"
            f"  or (last_over_time({c}[1h]) + 0)\n"
            f") unless (resets({c}[2h]) > 0)\n"
            f"or increase({c}[1h])")


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())


@dataclass(frozen=True)
class Rule:
    """One recorded figure: the report's counter ``key`` summed by ``by``."""

    key: str
    family: str
    by: tuple[str, ...]
    help: str

    @property
    def record(self) -> str:
        level = "_".join(self.by)
        unit = "joules" if self.key == "energy" else "seconds"
        return f"{level}:l9gpu_gpu_{self.key}_{unit}:increase1h"

    def expr(self) -> str:
        if self.key == "stalled":
            return stalled_expr(self.by)
        return f"sum by ({', '.join(self.by)}) (\n{_indent(hourly_increase(self.family))}\n)"


def stalled_expr(by: Sequence[str]) -> str:
    """GPU-seconds stalled in the hour before the evaluation, summed by ``by``: the agent's
    0/1 ``container_gpu_stalled`` a minute at a time, from the minute the hour begins to the
    one before it ends (the next hour has that one), each GPU once per group however many
    containers of the group are on it."""
    gpu = ", ".join((*by, "node", "gpu", "uuid", "gpu_instance"))
    return (f"60 * sum by ({', '.join(by)}) (\n"
            f"  sum_over_time((max by ({gpu}) (container_gpu_stalled))[1h:1m] offset 1ms)\n"
            f")")


RULES = (
    Rule("allocated", "container_gpu_allocation_seconds_total", ("namespace", "model"),
         "GPU-seconds allocated (held) per namespace and GPU model in the hour"),
    Rule("used", "container_gpu_usage_seconds_total", ("namespace", "model"),
         "GPU-seconds of SM time per namespace and GPU model in the hour"),
    Rule("idle", "container_gpu_idle_seconds", ("namespace", "model"),
         "seconds GPUs were held at 0% SM (zombie hours) per namespace and GPU model in the hour"),
    Rule("energy", "container_gpu_energy_joules_total", ("namespace", "model"),
         "joules of GPU board energy per namespace and GPU model in the hour"),
    Rule("capacity", "gpu_capacity_seconds_total", ("model",), "GPU-seconds that existed per GPU model in the hour"),
    Rule("unallocated", "gpu_unallocated_seconds_total", ("model",),
         "GPU-seconds nobody held per GPU model in the hour"),
    Rule("unhealthy", "gpu_unhealthy_seconds_total", ("model",),
         "GPU-seconds with an unhealthy verdict per GPU model in the hour"),
)
# Per namespace, training job (absent for a workload of no job) and GPU model (--by job, and
# the stalled GPU-hours of every grouping, docs/TRAINING.md).
JOB_RULES = (
    *(replace(rule, by=JOB, help=rule.help.replace("per namespace", "per namespace, training job"))
      for rule in RULES if "namespace" in rule.by),
    Rule("stalled", "container_gpu_stalled", JOB,
         "GPU-seconds stalled (busy with no work, docs/TRAINING.md) per namespace, training job and GPU model in the "
         "hour"),
)
STALLED_RULE = JOB_RULES[-1]
BY_KEY = {rule.key: rule for rule in RULES}
WORKLOAD_RULES = tuple(rule for rule in RULES if "namespace" in rule.by)
DEVICE_RULES = tuple(rule for rule in RULES if "namespace" not in rule.by)
# stage 1 of the served-model group: the workload counters per pod
POD_RULES = tuple(replace(rule, by=POD, help=rule.help.replace("per namespace", "per pod")) for rule in WORKLOAD_RULES)
TOKENS = "namespace_pod_model_name:l9gpu_inference_{field}:increase1h"
IDLE_POD = "namespace_pod:l9gpu_inference_idle_seconds:increase1h"
SHARE = "namespace_pod_model_name:l9gpu_inference_token_share:ratio1h"


@dataclass(frozen=True)
class SplitRule:
    """One figure per namespace, served model and GPU model (stage 3): ``source``, a
    per-pod expression of stage 1's records, split between each pod's models by stage 2's
    shares."""

    key: str
    record: str
    source: str
    help: str


SPLIT_RULES = (
    *(SplitRule(rule.key, replace(rule, by=SPLIT).record, pod.record,
                rule.help.replace("per namespace and GPU model", "per namespace, served model and GPU model"))
      for rule, pod in zip(WORKLOAD_RULES, POD_RULES)),
    SplitRule("idle_gpu", "namespace_model_name_model:l9gpu_gpu_idle_serving_seconds:increase1h",
              f"({POD_RULES[0].record} * on (namespace, pod) group_left () ({IDLE_POD} / {INTERVAL_S}))",
              "GPU-seconds held in intervals in which the replica served no token, per namespace, served model "
              "and GPU model"),
)
MODEL_FIGURES = {  # per served model: the report's figure and how the hours add up over the period
    "prompt_tokens": ("model_name:l9gpu_inference_prompt_tokens:increase1h", "sum"),
    "generated_tokens": ("model_name:l9gpu_inference_generated_tokens:increase1h", "sum"),
    "idle_replica_seconds": ("model_name:l9gpu_inference_idle_replica_seconds:increase1h", "sum"),
    "replicas": ("model_name:l9gpu_inference_replicas:count1h", "max"),
}


def _share() -> str:
    """Per pod and served model, the model's share of the pod's tokens in the hour; equal
    shares where the pod served none."""
    tokens = ("sum by (namespace, pod, model_name) "
              f'({{__name__=~"{TOKENS.format(field="(prompt|generated)_tokens")}"}})')
    return (f"{tokens}\n"
            f"  / on (namespace, pod) group_left () (sum by (namespace, pod) ({tokens}) > 0)\n"
            f"or on (namespace, pod, model_name)\n"
            f"(0 * {tokens} + 1)\n"
            f"  / on (namespace, pod) group_left () count by (namespace, pod) ({tokens})")


def _split(source: str) -> str:
    """``source`` (per namespace, pod and GPU model) split by each pod's token shares and
    summed per namespace, served model and GPU model. A pod on one GPU model is split
    between its models (``group_right``); a pod on several GPU models serving one model
    pays it all (``group_left``); a pod serving nothing is in `NONE_GROUP`; one on several
    GPU models serving several models in `UNSPLIT_GROUP`."""
    several = "on (namespace, pod) count by (namespace, pod)"
    return (f"sum by ({', '.join(SPLIT)}) (\n"
            f"  ({source} unless {several} ({source}) > 1)\n"
            f"    * on (namespace, pod) group_right (model) {SHARE}\n"
            f"  or {source}\n"
            f"    * on (namespace, pod) group_left (model_name) ({SHARE} unless {several} ({SHARE}) > 1)\n"
            f'  or label_replace({source} unless on (namespace, pod) {SHARE}, "model_name", "{NONE_GROUP}", "", "")\n'
            f"  or label_replace(\n"
            f"    {source} and {several} ({SHARE}) > 1 and {several} ({source}) > 1,\n"
            f'    "model_name", "{UNSPLIT_GROUP}", "", "")\n'
            f")")


STAGES = (1, 2, 3)


def model_rules(engines: Sequence[Engine], stage: int | None = None) -> list[tuple[str, str, str]]:
    """The served-model group's rules as (comment, record, expression): those of ``stage``
    (each reads the records of the stages before it), or all in order."""
    out: list[tuple[str, str, str]] = []
    if stage in (None, 1):
        out += [(rule.help, rule.record, rule.expr()) for rule in POD_RULES]
        for field in TOKEN_FIELDS:
            expr = union(engines, field, "sum", lambda sel: " ".join(hourly_increase(sel.text('pod!=""')).split()))
            assert expr, "prompt_tokens and generated_tokens are required fields"
            out.append((f"{field.replace('_', ' ')} per pod and served model in the hour",
                        TOKENS.format(field=field), expr))
        texts = [text for *_, text in token_candidates(engines)]
        res = f"{IDLE_RESOLUTION_S}s"
        out.append((f"seconds per pod in {IDLE_RESOLUTION_S // 60}-minute intervals in which it held GPUs and served "
                    "no token", IDLE_POD,
                    f"{IDLE_RESOLUTION_S} * count_over_time((\n{_indent(idle_expression(texts, None))}\n)[1h:{res}]"
                    " offset 1ms)"))
    if stage in (None, 2):
        out.append(("each served model's share of its pod's tokens in the hour (equal where it served none)",
                    SHARE, _share()))
    if stage in (None, 3):
        out += [(rule.help, rule.record, _split(rule.source)) for rule in SPLIT_RULES]
        for field in TOKEN_FIELDS:
            out.append((f"{field.replace('_', ' ')} per served model in the hour", MODEL_FIGURES[field][0],
                        f"sum by (model_name) ({TOKENS.format(field=field)})"))
        out.append(("replica-seconds spent serving no token per served model in the hour",
                    MODEL_FIGURES["idle_replica_seconds"][0],
                    f"sum by (model_name) ({IDLE_POD} * on (namespace, pod) group_right () {SHARE})"))
        out.append(("replicas (pods) that served the model in the hour", MODEL_FIGURES["replicas"][0],
                    f"count by (model_name) ({SHARE})"))
        out.append(("1 per hour evaluated (after every other rule of the group)", MODEL_EVALUATIONS, "vector(1)"))
    return out


def _rule_lines(comment: str, record: str, expr: str) -> list[str]:
    lines = [f"      # {comment}", f"      - record: {record}"]
    if "\n" not in expr:
        return lines + [f"        expr: {expr}"]
    return lines + ["        expr: |"] + [f"          {line}" for line in expr.splitlines()]


def rules_yaml(engines: Sequence[Engine] | None = None, stage: int | None = None) -> str:
    """alerts/l9gpu-chargeback.rules.yaml (``stage``: the rules of that stage only,
    for ``promtool tsdb create-blocks-from rules``)."""
    engines = load_engines() if engines is None else engines
    lines = [
        "# Chargeback recording rules for `l9gpu report --source rules` (docs/CHARGEBACK.md), generated by",
        "# `python -m exporter.report.rules` (make docs). Every hour, per namespace and GPU model (per GPU",
        "# model for the GPUs themselves): what the agent's counters rose by in the hour, by the report's own",
        "# rule, increase() for a series that was reset in the hour. One sample per group and hour survives",
        "# downsampling; a month's report reads a few thousand samples instead of every container's.",
        "# The second group splits each pod's hour between the models it serves by their tokens (--by model):",
        "# its rules read the ones before them in the group. Backfilling with promtool, evaluate",
        "# `python -m exporter.report.rules --stage 1`, then `--stage 2` and 3 (docs/CHARGEBACK.md).",
        "# The group per training job keeps the job of each workload (--by job, and the stalled GPU-hours).",
        "groups:",
    ]
    if stage in (None, 1):
        lines += [f"  - name: {GROUP}", f"    interval: {INTERVAL_S // 3600}h", "    rules:",
                  f"      - record: {EVALUATIONS}", "        expr: vector(1)"]
        for rule in RULES:
            lines += _rule_lines(rule.help, rule.record, rule.expr())
        lines += [f"  - name: {JOB_GROUP}", f"    interval: {INTERVAL_S // 3600}h", "    rules:"]
        for rule in JOB_RULES:
            lines += _rule_lines(rule.help, rule.record, rule.expr())
    lines += [f"  - name: {MODEL_GROUP}", f"    interval: {INTERVAL_S // 3600}h", "    rules:"]
    for comment, record, expr in model_rules(engines, stage):
        lines += _rule_lines(comment, record, expr)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exporter.report.rules",
        description="Print the chargeback recording rules (alerts/l9gpu-chargeback.rules.yaml).")
    parser.add_argument("--stage", type=int, choices=STAGES,
                        help="only the rules of this stage, for promtool tsdb create-blocks-from rules, which lets "
                             "no rule read another's results: stage 1, then 2, then 3")
    args = parser.parse_args(argv)
    print(rules_yaml(stage=args.stage), end="")
    return 0


def usable(by: str, selector: str, price_keys: set[str], custom_engines: bool) -> str | None:
    """Why the rules cannot answer this report (None: they can)."""
    if by not in ("namespace", MODEL_BY, JOB_BY):
        return f"--by {by}: the rules are per namespace, training job, served model and GPU model"
    if by == MODEL_BY and custom_engines:
        return "--engines: the rules read the built-in engines"
    if selector:
        return "--selector: the rules keep no label but namespace, training job and model"
    extra = sorted(price_keys - {"namespace", "model"})
    if extra:
        return f"price overrides on {', '.join(extra)}: the rules keep no label but namespace, training job and model"
    return None


async def fetch(prom: Any, grid: Any, stats: Any, models: bool = False, jobs: bool = False) -> Recorded | None:
    """The period's figures from the recording rules, per step (None: no rule evaluated in
    the period); ``models``: per namespace, served model and GPU model (`MODEL_GROUP`),
    with each served model's figures over the period; ``jobs``: per namespace, training job
    and GPU model (`JOB_GROUP`). The stalled GPU-seconds come from `JOB_GROUP` whatever
    the grouping (rows of their own, which group like the others by namespace)."""
    from exporter.report.compute import SeriesTotals, series_key
    from exporter.report.prom import all_of

    bounds = grid.bounds
    n = grid.regular
    g = grid.step_ms
    steps = len(bounds) - 1
    span = bounds[-1] - bounds[0]
    t = [b / 1000 for b in bounds]
    hour = INTERVAL_S * 1000
    # --by model splits pods between served models: the stalled rows (per job) are left out there
    workload: Sequence[Rule | SplitRule] = JOB_RULES if jobs else SPLIT_RULES if models else (*WORKLOAD_RULES,
                                                                                               STALLED_RULE)
    read = [*workload, *DEVICE_RULES]
    # asked as a range of one point: every answer the report reads first is a matrix
    evaluations = MODEL_EVALUATIONS if models else EVALUATIONS
    asked: list[Any] = [prom.query_range(f"count_over_time({evaluations}[{span - 1}ms])", t[-1], t[-1], 60)]
    for rule in read:
        if n >= 1:
            asked.append(prom.query_range(f"sum_over_time({rule.record}[{g - 1}ms])", t[1], t[n], g / 1000))
        tail = bounds[-1] - bounds[n] if steps > n else 0
        asked.append(prom.query(f"sum_over_time({rule.record}[{tail - 1}ms])", t[-1], expect="vector")
                     if tail else _nothing())
    allocated = workload[0].record
    edges = [prom.query(f"sum(sum_over_time({allocated}[{hour - 1}ms]))", min(t[0] + INTERVAL_S, t[-1]),
                        expect="vector"),
             prom.query(f"sum(sum_over_time({allocated}[{hour - 1}ms]))", t[-1], expect="vector")]
    figures = [prom.query(f"{how}_over_time({record}[{span - 1}ms])", t[-1], expect="vector")
               for record, how in MODEL_FIGURES.values()] if models else []
    answers = await all_of(*asked, *edges, *figures)
    evaluated = sum(float(v) for s in answers[0] for _, v in s["values"])
    if not evaluated:
        return None
    index = {b / 1000: k for k, b in enumerate(bounds)}
    rows: dict[str, dict[Any, SeriesTotals]] = {"workload": {}, "device": {}}
    for i, rule in enumerate(read):
        ranged, tail_answer = answers[1 + 2 * i], answers[2 + 2 * i]
        kind = "workload" if rule in workload else "device"
        for series in ranged if n >= 1 else ():
            row = _row(rows[kind], series_key(series["metric"]), rule.key, steps, SeriesTotals)
            for ts, v in series["values"]:
                k = index.get(ts)
                if k:
                    row[k - 1] += float(v)
        for series in tail_answer:
            _row(rows[kind], series_key(series["metric"]), rule.key, steps, SeriesTotals)[-1] += \
                float(series["value"][1])
    after = 1 + 2 * len(read)
    edge = sum(float(s["value"][1]) for answer in answers[after:after + 2] for s in answer)
    per_model: dict[str, dict[str, float]] | None = None
    if models:
        per_model = {}
        for key, answer in zip(MODEL_FIGURES, answers[after + 2:]):
            for series in answer:
                name = series["metric"].get("model_name", "")
                per_model.setdefault(name, {})[key] = float(series["value"][1])
    stats.queries = prom.queries
    return Recorded(list(rows["workload"].values()), list(rows["device"].values()),
                    hours_evaluated=int(evaluated), hours=span / 3.6e6, error_bound_seconds=edge, models=per_model)


def _row(rows: dict[Any, Any], key: Any, counter: str, steps: int, factory: Any) -> list[float]:
    row = rows.get(key)
    if row is None:
        row = rows[key] = factory(dict(key))
    return row.steps.setdefault(counter, [0.0] * steps)  # type: ignore[no-any-return]


async def _nothing() -> list[Any]:
    return []


@dataclass
class Recorded:
    """What the rules recorded over the period: rows per (namespace, model), or (namespace,
    model_name, model), and per GPU model, per step, in the agent's units; how many hours
    were evaluated of the period's; the allocated GPU-seconds of the hours at its two ends
    (the error bound); per served model, its tokens, idle replica-seconds and most replicas
    in an hour."""

    series: list[Any]
    devices: list[Any]
    hours_evaluated: int
    hours: float
    error_bound_seconds: float
    models: dict[str, dict[str, float]] | None = None  # per served model: `MODEL_FIGURES` over the period


if __name__ == "__main__":
    raise SystemExit(main())
