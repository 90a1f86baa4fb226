"""The label schema: which labels a series carries, in which order, and their values.

Every GPU series starts with the device labels (`DEVICE_LABELS`, values from
`device_label_values`); a workload series adds who it is (`WORKLOAD_ID_LABELS`, values from
`workload_id_values`), then the owner (`OWNER_LABELS`) and one ``label_<key>`` per
``--pod-label KEY`` (`label_schema`); a per-process series adds ``pid`` and ``comm``. The
catalogue, `derive`, `render`, `dcgm` and `snapshot_json` all take names and values from
here, so the order a series' values are in is decided once.

Last come the training job and rank (`TRAINING_LABELS`), and only where the workload has
them: its values end with `training_values`, which is empty for a workload of no job and
the job alone where there is no rank. A family's label names list them last, and
prometheus_client pairs names with values with ``zip``, which stops at the shorter: so a
series of no job carries neither label (absent, not empty) without a look at any value
while rendering. Whoever adds names after them (``kind``, ``role``) puts those first.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

from exporter.core.model import DeviceSample, Workload

# Labels on every GPU series. ``gpu_instance`` is the MIG GPU instance ("" otherwise).
DEVICE_LABELS: tuple[str, ...] = ("node", "gpu", "uuid", "model", "gpu_instance")
# Labels that say whose a workload series is ("" where not applicable).
WORKLOAD_ID_LABELS: tuple[str, ...] = ("namespace", "pod", "container", "pod_uid", "slurm_job_id")
WORKLOAD_LABELS: tuple[str, ...] = DEVICE_LABELS + WORKLOAD_ID_LABELS
# The distributed training job a workload is a rank of, and its rank (not ``job``:
# Prometheus' own target label). Last on every workload and process series, and only where set.
TRAINING_LABELS: tuple[str, ...] = ("training_job", "training_rank")
PROCESS_LABELS: tuple[str, ...] = WORKLOAD_LABELS + ("pid", "comm") + TRAINING_LABELS

# The owner of a pod (top-level controller) and of a Slurm job (user, account): one value
# per workload, so they add no series, and chargeback can group by them.
OWNER_LABELS: tuple[str, ...] = ("owner_kind", "owner_name", "slurm_user", "slurm_account")

# The prefix of the label a ``--pod-label KEY`` adds: ``label_<key>``.
POD_LABEL_PREFIX = "label_"

# Label values a workload series gets after the device labels: its `WORKLOAD_ID_LABELS`
# values, then the configured extras (owner, pod labels). A function of the owner, so
# configured extras stay out of the modules that only pass a labeller along.
Labeller = Callable[[Workload], tuple[str, ...]]


def device_label_values(node: str, device: DeviceSample) -> tuple[str, ...]:
    """Values for `DEVICE_LABELS`."""
    return (node, str(device.index), device.uuid, device.model, device.gpu_instance)


def workload_id_values(workload: Workload) -> tuple[str, ...]:
    """Values for `WORKLOAD_ID_LABELS`: namespace, pod, container, pod_uid, slurm_job_id.

    Two owners with equal values are the same workload as far as the series tell."""
    return (workload.namespace, workload.pod, workload.container, workload.pod_uid, workload.slurm_job_id)


def training_values(workload: Workload) -> tuple[str, ...]:
    """Values for `TRAINING_LABELS`, as many as are set: () for a workload of no job,
    (job,) for a job without ranks, (job, rank)."""
    job = workload.training_job
    if not job:
        return ()
    rank = workload.training_rank
    return (job, rank) if rank else (job,)


def workload_key(workload: Workload) -> tuple[str, ...]:
    """Who a workload is, as its series tell: `workload_id_values` and `training_values`
    (two ranks of one Slurm job on a node are two workloads)."""
    return workload_id_values(workload) + training_values(workload)


def default_labeller(workload: Workload) -> tuple[str, ...]:
    """The labeller without configured extras: `workload_id_values` alone."""
    return workload_id_values(workload)


# A Kubernetes label key (apimachinery's IsQualifiedName): an optional prefix, a DNS
# subdomain of at most 253 characters, and "/", then a name of at most 63 characters.
_LABEL_KEY_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_KEY_GRAMMAR = ("a Kubernetes label key is a name of at most 63 letters, digits, '-', '_' or '.' that begins "
                     "and ends with a letter or digit, optionally after a DNS subdomain prefix and '/' "
                     "(e.g. team, app.kubernetes.io/name)")


def parse_pod_label_key(text: str) -> str:
    """A ``--pod-label KEY``: the key as given, when it can be a Kubernetes label key.

    Raises:
        ValueError: naming the label-key grammar, for a key no pod can carry (``bad label!``).
    """
    prefix, slash, name = text.rpartition("/")
    valid = (len(name) <= 63 and _LABEL_KEY_NAME.fullmatch(name) is not None
             and (not slash or (0 < len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix) is not None)))
    if not valid:
        raise ValueError(f"invalid pod label key {text!r}: {LABEL_KEY_GRAMMAR}")
    return text


def sanitize_label_name(key: str) -> str:
    """A Kubernetes label key as a Prometheus label name suffix (like kube-state-metrics)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def pod_label_name(key: str) -> str:
    """The label name a ``--pod-label KEY`` adds: ``label_<sanitized key>``."""
    return POD_LABEL_PREFIX + sanitize_label_name(key)


def label_schema(pod_labels: Sequence[str] = ()) -> tuple[tuple[str, ...], Labeller]:
    """Extra workload label names and the matching labeller.

    Workload series always carry the owner (``owner_kind``, ``owner_name``: Deployment,
    StatefulSet, Job, ...; ``slurm_user``, ``slurm_account`` for a Slurm job); each
    ``--pod-label KEY`` adds ``label_<key>`` with the pod's label value ("" when the pod has
    no such label); then ``training_job`` and ``training_rank`` where the workload has them.

    Returns:
        (the label names after `WORKLOAD_LABELS`, `TRAINING_LABELS` last; a labeller whose
        values are `workload_id_values` followed by one value for each of those names,
        the training ones only where set: `training_values`).
    """
    keys = list(dict.fromkeys(pod_labels))
    names = OWNER_LABELS + tuple(pod_label_name(k) for k in keys) + TRAINING_LABELS

    def labeller(workload: Workload) -> tuple[str, ...]:
        pod_labels_map = dict(workload.labels)
        return workload_id_values(workload) + (workload.owner_kind, workload.owner_name,
                                                workload.slurm_user, workload.slurm_account) + tuple(
            pod_labels_map.get(k, "") for k in keys) + training_values(workload)

    return names, labeller


def workload_label_map(values: Sequence[str], extra_names: Sequence[str] = ()) -> Mapping[str, str]:
    """A workload series' label values by name: `WORKLOAD_LABELS` then ``extra_names``.

    Args:
        values: the values in series order (`WorkloadUsage.labels`).
        extra_names: the names after `WORKLOAD_LABELS` (`label_schema`'s first element).
    """
    return dict(zip(WORKLOAD_LABELS + tuple(extra_names), values))
