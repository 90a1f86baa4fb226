"""The distributed training job a workload is a rank of, as its scheduler names it.

Schedulers that start a job's ranks as pods write who each pod is into its labels (and
some into its annotations). `from_pod` reads those keys and returns the pod's
(job, rank); `from_slurm` does the same for a Slurm job's process. Both are pure: the
API-server watch, the CRI fallback and the Slurm path call them on what they saw.

A rank is written the way the scheduler names the pod after its job's name, so it can be
found in ``kubectl get pods``: a Kubeflow PyTorchJob's ``llama-worker-3`` is rank
``worker-3``; a JobSet's (and a Kubeflow TrainJob's) ``llama-node-0-3-x7k2p`` is rank
``node-0-3`` (replicated job, job index, completion index); a Volcano job's
``llama-worker-3`` is ``worker-3`` (task, task index); a LeaderWorkerSet's group 2,
worker 1 is ``2-1``; an Indexed Job's completion index 3 is ``3``; a Slurm task is its
``SLURM_PROCID``. KubeRay puts no rank on its pods: a Ray cluster's pods get the job only.
A pod of no job gets ("", ""). Every key is listed, with its source, in
docs/ATTRIBUTION.md ("Job and rank").
"""

from __future__ import annotations

from typing import Callable, Mapping

# (job, rank); ("", "") for a workload of no job. A rank never stands without its job.
Identity = tuple[str, str]
NO_JOB: Identity = ("", "")

# Kubeflow training-operator v1 (PyTorchJob, TFJob, MPIJob, XGBoostJob, PaddleJob, JAXJob):
# kubeflow/common pkg/apis/common/v1/constants.go. The replica type is lower-case on pods.
KUBEFLOW_JOB = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"
# Kubeflow Trainer v2 (TrainJob): the pods are a JobSet's, labelled with the TrainJob too
# (kubeflow/trainer constants.LabelTrainJobName, set through the runtime's pod labels).
TRAINJOB_NAME = "trainer.kubeflow.org/trainjob-name"
# JobSet: kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go (labels and annotations).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
# An Indexed Job's pods (Kubernetes batch/v1): the completion index is an annotation since
# 1.21 and a label since 1.28 (KEP-4017); the Job's name a label.
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"
JOB_NAME_LEGACY = "job-name"
# Volcano (volcano-sh/volcano createJobPod): job name as label and annotation, the task's
# name (task-spec) as annotation and label, the task index as annotation (and, in newer
# releases, label).
VOLCANO_JOB = "volcano.sh/job-name"
VOLCANO_TASK = "volcano.sh/task-spec"
VOLCANO_TASK_INDEX = "volcano.sh/task-index"
# LeaderWorkerSet: kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go.
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
# KubeRay: ray-project/kuberay ray-operator/controllers/ray/utils/constant.go.
RAY_CLUSTER = "ray.io/cluster"
# Slurm: the task's rank among the step's tasks (srun sets it in every task's environment).
SLURM_RANK = "SLURM_PROCID"

# Longest value kept: annotations are free text of any length (label values stop at 63).
_MAX_VALUE = 253

Lookup = Callable[[str], str]


def _lookup(labels: Mapping[str, str], annotations: Mapping[str, str]) -> Lookup:
    """A key's value from the labels, else the annotations; "" where neither has it."""

    def get(key: str) -> str:
        value = labels.get(key) or annotations.get(key) or ""
        return str(value).strip()[:_MAX_VALUE]

    return get


def _joined(*parts: str) -> str:
    return "-".join(part for part in parts if part)


def _jobset_rank(get: Lookup) -> str:
    return _joined(get(JOBSET_REPLICATED_JOB), get(JOBSET_JOB_INDEX), get(JOB_COMPLETION_INDEX))


def _trainer(get: Lookup) -> Identity | None:
    job = get(TRAINJOB_NAME)
    return (job, _jobset_rank(get)) if job else None


def _kubeflow(get: Lookup) -> Identity | None:
    job = get(KUBEFLOW_JOB)
    return (job, _joined(get(KUBEFLOW_REPLICA_TYPE).lower(), get(KUBEFLOW_REPLICA_INDEX))) if job else None


def _jobset(get: Lookup) -> Identity | None:
    job = get(JOBSET_NAME)
    return (job, _jobset_rank(get)) if job else None


def _volcano(get: Lookup) -> Identity | None:
    job = get(VOLCANO_JOB)
    return (job, _joined(get(VOLCANO_TASK), get(VOLCANO_TASK_INDEX))) if job else None


def _leaderworkerset(get: Lookup) -> Identity | None:
    job = get(LWS_NAME)
    return (job, _joined(get(LWS_GROUP_INDEX), get(LWS_WORKER_INDEX))) if job else None


def _kuberay(get: Lookup) -> Identity | None:
    job = get(RAY_CLUSTER)
    return (job, "") if job else None


def _indexed_job(get: Lookup) -> Identity | None:
    index = get(JOB_COMPLETION_INDEX)
    job = get(JOB_NAME) or get(JOB_NAME_LEGACY)
    return (job, index) if job and index else None


# First match wins: a TrainJob's pods are also a JobSet's, a JobSet's also an Indexed Job's.
_SCHEDULERS: tuple[Callable[[Lookup], Identity | None], ...] = (
    _trainer, _kubeflow, _jobset, _volcano, _leaderworkerset, _kuberay, _indexed_job)


def from_pod(labels: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> Identity:
    """The training job and rank of a pod, from its labels and annotations.

    Args:
        labels: the pod's labels.
        annotations: the pod's annotations (Volcano writes the task index there; JobSet
            and Indexed Jobs write their indices in both).

    Returns:
        (job, rank), ("", "") for a pod no scheduler above started; the rank is "" where
        the scheduler gives none (KubeRay).
    """
    get = _lookup(labels, annotations or {})
    for scheduler in _SCHEDULERS:
        found = scheduler(get)
        if found is not None:
            return found
    return NO_JOB


def from_slurm(job_id: str, environ: Mapping[str, str]) -> Identity:
    """A Slurm process's job and rank: the job id, and the task's ``SLURM_PROCID`` from its
    allow-listed environment ("" where the process has none, e.g. outside ``srun``)."""
    if not job_id:
        return NO_JOB
    return job_id, str(environ.get(SLURM_RANK, "")).strip()[:_MAX_VALUE]


__all__ = ["Identity", "NO_JOB", "from_pod", "from_slurm"]
