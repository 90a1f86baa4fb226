"""A stall as others read it: its incident JSON (``/api/v1/incidents``, the log line, the
OTLP log records), its Kubernetes Events' messages, and the one line the page's banner and
``l9gpu snapshot`` show ("GPU 5 busy with no work for 7m: batch/trainer-3 (job
llama-pretrain, rank 13)").
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

from exporter.core.escape import for_terminal
from exporter.core.model import Workload
from exporter.output.snapshot_json import describe_owner, duration, rfc3339, workload_json
from exporter.stall.policy import STALL_AFTER
from exporter.stall.tracker import Stall

KIND = "stalled"
# What to do about a stalled rank: its job must be restarted (the one odd rank is the lead).
ACTION = "restart_app"
EVENT_REASON = "GPUStalled"
EVENT_ENDED_REASON = "GPUStallEnded"


def who(workload: Workload) -> str:
    """A workload as the banner names it: ``batch/trainer-3 (job llama-pretrain, rank 13)``."""
    name = describe_owner(workload)
    if workload.kind == "kubernetes" and workload.container and workload.pod:
        name = f"{workload.namespace}/{workload.pod}"  # the pod is what the job's ranks are
    job = [f"job {workload.training_job}"] if workload.training_job else []
    job += [f"rank {workload.training_rank}"] if workload.training_rank else []
    return f"{name} ({', '.join(job)})" if job else name


def gpu_name(gpu: int, gpu_instance: str) -> str:
    return f"GPU {gpu}" + (f" MIG {gpu_instance}" if gpu_instance else "")


def headline(stall: Stall, now: float) -> str:
    """``GPU 5 busy with no work for 7m 2s: batch/trainer-3 (job llama-pretrain, rank 13)``."""
    holders = ", ".join(who(w) for w in stall.workloads) or "held by processes of no workload"
    return f"{gpu_name(stall.gpu, stall.gpu_instance)} busy with no work for {duration(stall.seconds(now))}: {holders}"


def signals_text(signals: Mapping[str, object]) -> str:
    """The matched signals in a few words: ``utilisation 100%, tensor 0%, DRAM 1%, power 23% of its limit``."""
    parts = []
    for key, label in (("utilization", "utilisation"), ("tensor_active", "tensor"), ("dram_active", "DRAM"),
                       ("power_ratio", "power")):
        value = signals.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {value * 100:.0f}%" + (" of its limit" if key == "power_ratio" else ""))
    for key, label in (("pcie_bytes_per_second", "PCIe"), ("nvlink_bytes_per_second", "NVLink")):
        value = signals.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {value / 1e6:.1f} MB/s")
    return ", ".join(parts)


def stall_id(stall: Stall) -> str:
    key = "|".join((stall.node, stall.uuid, stall.gpu_instance, KIND, f"{stall.began:.6f}"))
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def workload_entry(workload: Workload) -> dict[str, Any]:
    """`snapshot_json.workload_json` with the training job and rank, where the workload has them."""
    entry = workload_json(workload)
    if workload.training_job:
        entry["training_job"] = workload.training_job
    if workload.training_rank:
        entry["training_rank"] = workload.training_rank
    return entry


def stall_json(stall: Stall, now: float, stall_after: float = STALL_AFTER) -> dict[str, Any]:
    """A stall as ``/api/v1/incidents`` serves it: the keys of every incident (docs/INCIDENTS.md)
    and ``began``, ``ended`` (null while it lasts), ``duration_seconds``, ``end_reason``,
    ``signals`` (the values when it was declared) and ``signals_absent``."""
    seconds = stall.seconds(now)
    detail = (f"busy with no work since {rfc3339(stall.began)} ({signals_text(stall.signals)}); "
              + (f"ended after {duration(seconds)}: {stall.end_reason}" if stall.ended is not None
                 else f"lasting {duration(seconds)}"))
    return {
        "id": stall_id(stall), "kind": KIND, "time": stall.began, "time_rfc3339": rfc3339(stall.began),
        "node": stall.node, "gpu": stall.gpu, "uuid": stall.uuid, "gpu_instance": stall.gpu_instance,
        "xid": None, "action": ACTION, "caused_by": [],
        "affected": [workload_entry(w) for w in stall.workloads],
        "cause_known": False, "cause_basis": None, "detail": detail,
        "began": stall.began, "declared": stall.declared, "stall_after_seconds": stall_after,
        "ended": stall.ended, "ended_rfc3339": rfc3339(stall.ended) if stall.ended is not None else None,
        "duration_seconds": seconds, "end_reason": stall.end_reason or None,
        "signals": dict(stall.signals), "signals_absent": list(stall.absent),
    }


def event_messages(stall: Stall, now: float) -> list[tuple[Workload, str, str, str]]:
    """The Kubernetes Events of a stall on its pods: (workload, type, reason, one-line message):
    a Warning when it is declared, a Normal one when it ends."""
    where = f"{gpu_name(stall.gpu, stall.gpu_instance)} ({stall.uuid}, node {stall.node})"
    out = []
    for w in stall.workloads:
        rank = f" (job {w.training_job}, rank {w.training_rank})" if w.training_job and w.training_rank else (
            f" (job {w.training_job})" if w.training_job else "")
        if stall.ended is None:
            message = (f"{where} busy with no work for {duration(stall.seconds(now))}{rank}: a kernel is resident "
                       f"but nothing is computed or moved ({signals_text(stall.signals)}); a collective waiting "
                       "for a rank that never comes looks like this: find the job's rank that is not stalled")
            out.append((w, "Warning", EVENT_REASON, for_terminal(message)))
        else:
            message = f"{where} stall ended after {duration(stall.seconds(now))}{rank}: {stall.end_reason}"
            out.append((w, "Normal", EVENT_ENDED_REASON, for_terminal(message)))
    return out


def holders_json(workloads: Sequence[Workload]) -> list[dict[str, str]]:
    """Who holds a stalled GPU, for the page's banner and ``l9gpu snapshot``."""
    return [{"owner": who(w), **({"training_job": w.training_job} if w.training_job else {}),
             **({"training_rank": w.training_rank} if w.training_rank else {})} for w in workloads]
