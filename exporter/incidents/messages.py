"""An incident as others read it: its id, its JSON (``/api/v1/incidents``, the log line,
the OTLP log records) and the one-line messages of its Kubernetes Events (docs/INCIDENTS.md).
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from exporter.core.escape import for_terminal
from exporter.core.model import Workload
from exporter.incidents.engine import Incident, xid_action
from exporter.output.snapshot_json import describe_owner, rfc3339, training_text, workload_json


def incident_id(incident: Incident) -> str:
    """A short id, the same for an incident wherever it shows (the JSON, the OTLP log
    records of each workload it involves): a hash of node, GPU, kind, Xid and time."""
    key = "|".join((incident.node, incident.uuid, incident.gpu_instance, incident.kind, str(incident.xid),
                    f"{incident.time:.6f}"))
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def incident_json(incident: Incident, extra_names: Sequence[str] = ()) -> dict[str, Any]:
    """An incident as ``/api/v1/incidents`` serves it (docs/INCIDENTS.md)."""
    return {
        "id": incident_id(incident),
        "kind": incident.kind, "time": incident.time, "time_rfc3339": rfc3339(incident.time),
        "node": incident.node, "gpu": incident.gpu, "uuid": incident.uuid, "gpu_instance": incident.gpu_instance,
        "xid": incident.xid, "action": incident.action,
        "caused_by": [workload_json(w) for w in incident.caused_by],
        "affected": [workload_json(w) for w in incident.affected],
        "cause_known": incident.cause_known, "cause_basis": incident.cause_basis or None,
        "detail": incident.detail,
    }


def _what(incident: Incident) -> str:
    if incident.kind == "memory_exhausted":
        return "ran out of memory (inferred)"
    if incident.xid is not None:
        _, description = xid_action(incident.xid)
        return f"raised Xid {incident.xid} ({description}; action: {incident.action.replace('_', ' ')})"
    return f"reported {incident.kind.replace('_', ' ')} (action: {incident.action.replace('_', ' ')})"


def _as_rank(w: Workload) -> str:
    """`` (job llama, rank worker-3)`` for a pod that is a rank of a training job, else ""."""
    return f" ({training_text(w)})" if w.training_job else ""


def event_messages(incident: Incident) -> list[tuple[Workload, str, str]]:
    """The Kubernetes Events of an incident: (workload, reason, one-line message). A pod
    that is a rank of a training job has its job and rank in its message."""
    where = f"GPU {incident.gpu} ({incident.uuid}, node {incident.node})"
    what = _what(incident)
    out = []
    exhausted = incident.kind == "memory_exhausted"
    for w in incident.caused_by:
        this = "this container" + _as_rank(w)
        if exhausted:
            message = f"{where} {what}: {this} grew most before it filled"
        elif incident.cause_basis == "sole_holder":
            message = f"{where} {what}: {this} alone held the GPU then, so its process raised it"
        else:
            message = f"{where} {what}: this container's process{_as_rank(w)} raised it"
        out.append((w, "GPUMemoryExhausted" if exhausted else "GPUFaultCaused", for_terminal(message)))
    suspect = f"; suspected cause: {describe_owner(incident.caused_by[0])}" if incident.caused_by else ""
    for w in incident.affected:
        this = "this container" + _as_rank(w)
        message = (f"{where} {what} while {this} held it{suspect}" if exhausted
                   else f"{where} {what} while {this} held it")
        out.append((w, "GPUMemoryExhausted" if exhausted else "GPUFaultAffected", for_terminal(message)))
    return out
