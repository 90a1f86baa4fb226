"""The snapshot as JSON: what ``l9gpu snapshot --json`` prints and ``/api/v1/snapshot`` serves.

One function builds the document for both, so a script written against one reads the
other unchanged; the schema is documented in docs/SNAPSHOT.md. Units are in the key
names (``_bytes``, ``_watts``, ``_celsius``, ``_seconds``, ``_ratio`` for 0-1); a value
the device or driver does not give is ``null``, never 0. Consumers should ignore keys
they do not know: new keys are added without a schema change.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from exporter.core.escape import strict_json
from exporter.core.labels import POD_LABEL_PREFIX, workload_key, workload_label_map
from exporter.core.model import Snapshot, StuckCall, Workload, WorkloadUsage
from exporter.health import Verdict

#: Bumped only when a key changes meaning or goes away (never for added keys).
SCHEMA_VERSION = 1


def training_text(w: Workload) -> str:
    """The workload's training job and rank as people read them: ``job llama, rank worker-3``,
    ``job llama`` where there is no rank, "" for a workload of no job."""
    if not w.training_job:
        return ""
    return f"job {w.training_job}" + (f", rank {w.training_rank}" if w.training_rank else "")


def describe_owner(w: Workload) -> str:
    """A workload as people name it: ``namespace/pod/container``, ``slurm job 42 step 0 (bob)``,
    with its training job and rank where set: ``batch/llama-worker-3/main (job llama, rank
    worker-3)``, ``slurm job 42 step 0 rank 13 (bob)``."""
    if w.kind == "kubernetes":
        name = f"{w.namespace}/{w.pod}" if w.pod else f"pod {w.pod_uid or '?'}"
        name = f"{name}/{w.container}" if w.container else name
        return f"{name} ({training_text(w)})" if w.training_job else name
    if w.kind == "slurm":
        return f"slurm job {w.slurm_job_id}" + (f" step {w.slurm_step}" if w.slurm_step else "") + (
            f" rank {w.training_rank}" if w.training_rank else "") + (f" ({w.slurm_user})" if w.slurm_user else "")
    if w.kind in ("systemd", "docker"):
        return f"{w.kind} {w.unit or w.container_id[:12]}"
    if w.container_id:  # a container whose pod no source knows (yet), e.g. without a pod cgroup
        return f"container {w.container_id[:12]} (pod unknown)"
    return w.kind


def idle_holding(memory_used_bytes: int | None, sm_utilization: float | None) -> bool:
    """Holds GPU memory while its SM share is exactly 0 in this pass (an unknown SM share
    is not 0): the document's ``zombie`` key.

    One pass says little (per-process SM shares are point samples, 0 between kernels);
    the page calls a workload a zombie only after three such passes (``idle_seconds``
    says for how long it has lasted), the ``GPUZombieWorkload`` alert after an hour.
    """
    return bool(memory_used_bytes) and sm_utilization == 0.0


def rfc3339(unix_seconds: float) -> str:
    """Unix seconds as an RFC 3339 UTC time, to the millisecond (``2026-12-01T21:41:00.123Z``)."""
    moment = datetime.fromtimestamp(unix_seconds, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def duration(seconds: float | None) -> str:
    """``45s``, ``12m 5s``, ``1h 30m``, ``2d 3h``: two units at most."""
    if seconds is None:
        return "n/a"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def workload_json(workload: Workload) -> dict[str, Any]:
    """Who a workload is, in the keys the snapshot's workload entries use (for incidents)."""
    return {
        "kind": workload.kind, "owner": describe_owner(workload),
        "namespace": workload.namespace, "pod": workload.pod, "container": workload.container,
        "pod_uid": workload.pod_uid, "owner_kind": workload.owner_kind, "owner_name": workload.owner_name,
        "slurm_job_id": workload.slurm_job_id, "slurm_step": workload.slurm_step,
        "slurm_user": workload.slurm_user,
        "training_job": workload.training_job, "training_rank": workload.training_rank,
    }


def _workload_entry(usage: WorkloadUsage, pids: list[int], extra_names: Sequence[str]) -> dict[str, Any]:
    workload: Workload = usage.workload
    extras = workload_label_map(usage.labels, extra_names) if extra_names else {}
    return {
        "kind": workload.kind, "owner": describe_owner(workload),
        "namespace": workload.namespace, "pod": workload.pod, "container": workload.container,
        "pod_uid": workload.pod_uid, "owner_kind": extras.get("owner_kind", workload.owner_kind),
        "owner_name": extras.get("owner_name", workload.owner_name),
        "pod_labels": {name.removeprefix(POD_LABEL_PREFIX): value
                       for name, value in extras.items() if name.startswith(POD_LABEL_PREFIX)},
        "slurm_job_id": workload.slurm_job_id, "slurm_step": workload.slurm_step,
        "slurm_user": workload.slurm_user,
        "training_job": workload.training_job, "training_rank": workload.training_rank,
        "memory_used_bytes": usage.memory_used_bytes, "sm_utilization_ratio": usage.utilization,
        "processes": usage.processes, "pids": pids, "idle_seconds": usage.idle_seconds,
        "allocated": usage.allocated,
        "usage_seconds_total": usage.usage_seconds_total,
        "allocation_seconds_total": usage.allocation_seconds_total,
        "energy_joules_total": usage.energy_joules_total,
        "zombie": idle_holding(usage.memory_used_bytes, usage.utilization),
        "allocated_unused": usage.allocated is True and usage.processes == 0 and not usage.memory_used_bytes,
    }


def snapshot_document(snap: Snapshot, extra_label_names: Sequence[str] = (),
                      gpm_status: Mapping[tuple[int, str], str] | None = None) -> dict[str, Any]:
    """The snapshot as plain JSON-able data (see docs/SNAPSHOT.md for every key).

    Args:
        snap: a published snapshot.
        extra_label_names: the names of the workload label values after the id labels
            (``labels.label_schema``: ``owner_kind``, ``owner_name``, ``label_<key>``).
        gpm_status: GPM status per (GPU index, MIG instance) from the backend ("active",
            warming up, or "unsupported: <reason>"); "" for devices it does not name.
    """
    processes: dict[str, list[Any]] = {}
    for row in snap.processes:
        processes.setdefault(row.device_key, []).append(row)
    allocations: dict[str, list[Any]] = {}
    for alloc in snap.allocations:
        allocations.setdefault(alloc.device_key, []).append(alloc)
    workloads: dict[str, list[WorkloadUsage]] = {}
    for usage in snap.workloads:
        if usage.present:  # gone workloads keep only their counters, for the grace period
            workloads.setdefault(usage.device_key, []).append(usage)
    unattributed = {u.device_key: u for u in snap.unattributed}
    stuck_by_device = {key: call for call in snap.stuck for key in call.devices}
    index_of = {d.key: d.index for d in snap.devices}

    gpus = []
    for d in snap.devices:
        rows = processes.get(d.key, [])
        rest = unattributed.get(d.key)
        entries = []
        for usage in workloads.get(d.key, []):
            ident = workload_key(usage.workload)
            pids = [r.pid for r in rows if r.workload.attributed and workload_key(r.workload) == ident]
            entries.append(_workload_entry(usage, pids, extra_label_names))
        gpus.append({
            "index": d.index, "uuid": d.uuid, "model": d.model, "vendor": d.vendor,
            "gpu_instance": d.gpu_instance, "up": d.up, "error": d.error,
            "stuck": _stuck_entry(stuck_by_device[d.key], index_of) if d.key in stuck_by_device else None,
            "utilization_ratio": d.utilization, "memory_used_bytes": d.memory_used_bytes,
            "memory_total_bytes": d.memory_total_bytes, "power_watts": d.power_watts,
            "power_limit_watts": d.power_limit_watts,
            "temperature_celsius": d.temperature_celsius,
            "gpm": dict(d.gpm), "gpm_status": (gpm_status or {}).get((d.index, d.gpu_instance), ""),
            "health": health_entry(snap.verdicts.get(d.key)),
            "processes": [{
                "pid": r.pid, "comm": r.comm, "memory_used_bytes": r.used_memory_bytes,
                "sm_utilization_ratio": r.sm_utilization, "owner": describe_owner(r.workload),
                "kind": r.workload.kind,
                "namespace": r.workload.namespace, "pod": r.workload.pod, "container": r.workload.container,
                "pod_uid": r.workload.pod_uid, "slurm_job_id": r.workload.slurm_job_id,
                "container_id": r.workload.container_id, "owner_kind": r.workload.owner_kind,
                "owner_name": r.workload.owner_name, "slurm_step": r.workload.slurm_step,
                "slurm_user": r.workload.slurm_user, "unit": r.workload.unit,
                "training_job": r.workload.training_job, "training_rank": r.workload.training_rank,
            } for r in rows],
            "allocations": [{
                "namespace": a.workload.namespace, "pod": a.workload.pod, "container": a.workload.container,
                "pod_uid": a.workload.pod_uid, "resource_name": a.resource_name, "device_id": a.device_id,
            } for a in allocations.get(d.key, [])],
            "workloads": entries,
            "unattributed": {
                "memory_used_bytes": rest.memory_used_bytes if rest is not None else None,
                "processes": rest.processes if rest is not None else 0,
            },
        })
    return {"schema_version": SCHEMA_VERSION, "node": snap.node, "timestamp": snap.timestamp,
            "timestamp_rfc3339": rfc3339(snap.timestamp), "seq": snap.seq,
            "gpus": gpus, "stuck": [_stuck_entry(call, index_of) for call in snap.stuck]}


def health_entry(verdict: Verdict | None) -> dict[str, Any] | None:
    """A device's ``health`` object: its verdict's state, action and reasons (None before one)."""
    if verdict is None:
        return None
    return {"state": verdict.state, "action": verdict.action,
            "reasons": [{"reason": r.reason, "action": r.action, "text": r.text} for r in verdict.reasons]}


def _stuck_entry(call: StuckCall, index_of: Mapping[str, int]) -> dict[str, Any]:
    return {"backend": call.backend, "what": call.what, "call": call.call, "since": call.since,
            "seconds": call.seconds, "gpus": sorted({index_of[k] for k in call.devices if k in index_of})}


def document_json(doc: dict[str, Any], pretty: bool = True) -> str:
    """A snapshot document as JSON text ending in a newline.

    Indented for people (``l9gpu snapshot --json``) or compact for programs
    (``/api/v1/snapshot``): Python's C encoder only runs without indentation, about four
    times faster on a busy node (docs/PERFORMANCE.md). Always strict JSON: a NaN or
    infinite value (a driver's or a scenario's) is written as ``null``, and strings are
    escaped by JSON itself (control characters as ``\\u001b``).
    """
    if pretty:
        return strict_json(doc, indent=2) + "\n"
    return strict_json(doc, separators=(",", ":")) + "\n"


def snapshot_json(snap: Snapshot, extra_label_names: Sequence[str] = (), pretty: bool = True,
                  gpm_status: Mapping[tuple[int, str], str] | None = None) -> str:
    """`snapshot_document` as JSON text (see `document_json`)."""
    return document_json(snapshot_document(snap, extra_label_names, gpm_status), pretty)
