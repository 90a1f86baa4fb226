"""A distributed training job on the simulated node: the ``training`` scenario's ``training`` block.

Each GPU runs one rank of one job (a Kubeflow PyTorchJob's worker pod, with the labels
the training operator puts on it). The ranks go through the block's ``phases`` together
(compute, a checkpoint that leaves the GPUs idle, an evaluation, ...), cycling, until
``wedge_at``; then every rank wedges in a collective (a kernel resident doing no work) but
the ``odd_rank``, which does what ``odd`` says (idle by default: the rank whose host side
died and that the others wait for). A ``throttled_gpu`` is a hardware straggler: hot, its
SM clock held down, its thermal slowdown reasons active, while it computes.

Format (see ``scenarios/training.yaml``)::

    training:
      job: llama-pretrain            # the PyTorchJob
      namespace: batch
      pod: "llama-pretrain-worker-{rank}"
      container: pytorch
      ranks: 0-7                     # the ranks this node holds, one per GPU in GPU order (or 0,1,5)
      odd_rank: 5                    # the rank that does not wedge (none: all wedge)
      throttled_gpu: none            # a GPU index, or none
      memory_gib: 71
      pid: 70001                     # rank i's process is pid + its GPU index
      wedge_at: 3m                   # default: the end of the phases
      phases: [{name: compute, for: 40s, utilization: 0.98, tensor: 0.85}, ...]
      wedged: {utilization: 1.0, tensor: 0.0, power: 0.15, traffic: 0.0}
      odd: {utilization: 0.0}

Several agents can play the nodes of one job: the environment overrides the node's name and
the block's settings (`ENVIRONMENT`), e.g. ``L9GPU_TRAINING_NODE=gpu-b L9GPU_TRAINING_RANKS=8-15``
(docs/TRAINING.md).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from exporter.devices.simulated.health import HealthScenarioError, scenario_duration
from exporter.devices.simulated.processes import GIB, Phase, ProcessSpec, ScenarioError, number

# Environment variable -> the setting it overrides (``node`` is the scenario's node name).
ENVIRONMENT = {
    "L9GPU_TRAINING_NODE": "node",
    "L9GPU_TRAINING_RANKS": "ranks",
    "L9GPU_TRAINING_ODD_RANK": "odd_rank",
    "L9GPU_TRAINING_THROTTLED_GPU": "throttled_gpu",
    "L9GPU_TRAINING_WEDGE_AT": "wedge_at",
}
KUBEFLOW_JOB = "training.kubeflow.org/job-name"
KUBEFLOW_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_INDEX = "training.kubeflow.org/replica-index"


def with_environment(data: Any, environ: Mapping[str, str]) -> Any:
    """The scenario document with what the environment overrides (only one with a ``training`` block)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("training"), Mapping):
        return data
    out, block = dict(data), dict(data["training"])
    for variable, key in ENVIRONMENT.items():
        value = environ.get(variable, "").strip()
        if value:
            if key == "node":
                out["node"] = value
            else:
                block[key] = value
    out["training"] = block
    return out


def _ranks(where: str, value: Any, count: int) -> list[int]:
    """``0-7``, ``8-15``, ``0,1,5`` or a list: the ranks, at most one per GPU."""
    try:
        if isinstance(value, list):
            ranks = [int(v) for v in value]
        else:
            ranks = []
            for part in str(value).split(","):
                low, _, high = part.strip().partition("-")
                ranks += list(range(int(low), int(high) + 1)) if high else [int(low)]
    except ValueError:
        raise ScenarioError(f"{where}.ranks: expected ranks like 0-7 or 0,1,5, got {value!r}") from None
    if not ranks or len(ranks) > count or min(ranks) < 0 or len(set(ranks)) != len(ranks):
        raise ScenarioError(f"{where}.ranks: expected 1 to {count} distinct ranks >= 0 (one per GPU), got {value!r}")
    return ranks


def _optional_int(where: str, value: Any) -> int | None:
    if value is None or str(value).strip().lower() in ("none", ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise ScenarioError(f"{where}: expected a whole number or none, got {value!r}") from None


def _seconds(where: str, value: Any) -> float:
    try:
        return scenario_duration(where, value)
    except HealthScenarioError as exc:
        raise ScenarioError(str(exc)) from None


def _phase(where: str, doc: Any, name: str = "") -> Phase:
    if not isinstance(doc, Mapping):
        raise ScenarioError(f"{where}: expected a mapping with utilization (and tensor, power, traffic)")
    values = [number(f"{where}.{key}", doc.get(key, default)) for key, default in
              (("utilization", 0.0), ("tensor", 1.0), ("power", 1.0), ("traffic", 1.0))]
    if any(v > 1.0 for v in values):
        raise ScenarioError(f"{where}: utilization, tensor, power and traffic are ratios 0-1")
    return Phase(str(doc.get("name", name)), *values)


def _plan(where: str, block: Mapping[str, Any]) -> tuple[Callable[[float], Phase], Callable[[float], Phase]]:
    """(what a wedging rank does, what the odd rank does), by seconds since the rank started."""
    phases = block.get("phases") or []
    if not isinstance(phases, list) or not phases:
        raise ScenarioError(f"{where}.phases: expected a list of {{name, for, utilization, tensor}}")
    plan = [(_seconds(f"{where}.phases[{n}].for", p.get("for", "60s")) if isinstance(p, Mapping) else 0.0,
             _phase(f"{where}.phases[{n}]", p)) for n, p in enumerate(phases)]
    cycle = sum(length for length, _ in plan)
    if cycle <= 0:
        raise ScenarioError(f"{where}.phases: their lengths add up to nothing")
    wedge_at = _seconds(f"{where}.wedge_at", block["wedge_at"]) if block.get("wedge_at") is not None else cycle
    wedged = _phase(f"{where}.wedged", block.get("wedged", {"utilization": 1.0, "tensor": 0.0, "power": 0.15,
                                                          "traffic": 0.0}), "wedged")
    odd = _phase(f"{where}.odd", block.get("odd", {"utilization": 0.0}), "idle")

    def before(t: float) -> Phase:
        t %= cycle
        for length, phase in plan:
            if t < length:
                return phase
            t -= length
        return plan[-1][1]

    return (lambda t: wedged if t >= wedge_at else before(t)), (lambda t: odd if t >= wedge_at else before(t))


def training_processes(where: str, block: Any, count: int) -> tuple[list[ProcessSpec], frozenset[int]]:
    """The ranks' processes of a ``training`` block, and the GPUs it makes hardware stragglers."""
    if not isinstance(block, Mapping):
        raise ScenarioError(f"{where}: expected a mapping (job, ranks, phases, ...)")
    ranks = _ranks(where, block.get("ranks", f"0-{count - 1}"), count)
    odd_rank = _optional_int(f"{where}.odd_rank", block.get("odd_rank"))
    throttled = _optional_int(f"{where}.throttled_gpu", block.get("throttled_gpu"))
    if throttled is not None and not 0 <= throttled < count:
        raise ScenarioError(f"{where}.throttled_gpu: expected a GPU index 0-{count - 1} or none, got {throttled}")
    job = str(block.get("job", "train"))
    memory = number(f"{where}.memory_gib", block.get("memory_gib", 60)) * GIB
    base_pid = int(number(f"{where}.pid", block.get("pid", 70001), 2))
    wedging, odd = _plan(where, block)
    processes = []
    for gpu, rank in enumerate(ranks):
        pod = str(block.get("pod", f"{job}-worker-{{rank}}")).format(rank=rank)
        workload = {"namespace": str(block.get("namespace", "default")), "pod": pod,
                    "container": str(block.get("container", "pytorch")),
                    "owner": {"kind": "PyTorchJob", "name": job},
                    "labels": {KUBEFLOW_JOB: job, KUBEFLOW_TYPE: "worker", KUBEFLOW_INDEX: str(rank)}}
        processes.append(ProcessSpec(base_pid + gpu, gpu, "python", _constant(memory), _constant(0.0),
                                     workload, phases=odd if rank == odd_rank else wedging))
    return processes, frozenset({throttled} if throttled is not None else ())


def _constant(value: float) -> Callable[[float], float]:
    """A curve that stays at ``value`` (a rank holds its memory; its SM share is its phase's)."""
    return lambda t: value
