"""Join a PID's cgroup facts with pod metadata into its `Workload`.

Per pass: `ProcCache` gives each PID's cgroup owner (read once per process lifetime),
the `PodIndex` gives the pod's names, owner and labels by pod UID, and the container's
name by container id. The join itself runs every pass, so names appear as soon as the
watch delivers them and a process of an unknown pod keeps its pod UID meanwhile.

A container without a pod cgroup (kubelet ``--cgroups-per-qos=false``: containerd puts it
at ``/k8s.io/<id>``) has no pod UID in its path; its pod is found by container id, from
the API server's container statuses or the runtime's CRI listing. Until one of them
knows the id it counts as unattributed (kind "unknown", its container id kept), rather
than as a workload without any name, which every such container would share.
"""

from __future__ import annotations

import logging
import pwd
from typing import Any, Callable, Iterable, Mapping, Sequence

from exporter.attribution import cgroups, podresources, training
from exporter.attribution.kubernetes import PodIndex
from exporter.attribution.procfs import ProcCache, ProcFS, ProcInfo
from exporter.core.model import HOST, UNKNOWN, AllocationRow, DeviceSample, Workload

log = logging.getLogger(__name__)

HOST_PID_HINT = ("run the agent with hostPID: true, or mount the host's /proc (e.g. at /host/proc) and pass "
                 "--proc-root /host/proc")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


class ProcAttributor:
    """Resolves GPU PIDs through a proc root and a pod index.

    Args:
        proc_root: where the host's /proc is (``--proc-root``).
        index: pod metadata, filled by a pod source (the API watch or a static list).
        pod_source: the object keeping ``index`` current (``healthy()``, ``stop()``), or
            None when pod names are off.
        fallback: pod names from the container runtime (`cri.CriPodSource`: ``healthy()``,
            ``stop()``, ``missing(container_ids)``), or None; told about the container ids
            a pass could not name, so it can list them at once.
        user_name: uid -> user name for Slurm jobs (pwd lookup, falling back to the number).
        allocation_source: the kubelet's device allocations (`podresources.PodResourcesSource`
            or a static list: ``allocations()``, ``healthy()``, ``stop()``), or None when off.
        on_close: called by `close` (e.g. to remove a fixture tree).
    """

    def __init__(self, proc_root: str = "/proc", index: PodIndex | None = None, pod_source: Any = None,
                 user_name: Callable[[int], str] = _user_name, on_close: Callable[[], None] | None = None,
                 fallback: Any = None, allocation_source: Any = None):
        self.procfs = ProcFS(proc_root)
        self.cache = ProcCache(self.procfs)
        self.index = index if index is not None else PodIndex()
        self.pod_source = pod_source
        self.fallback = fallback
        self.allocation_source = allocation_source
        self.unknown_device_ids: tuple[str, ...] = ()
        # One Workload object per container (all its processes share it), per index generation.
        self._containers: dict[tuple[str, str], Workload] = {}
        self._containers_generation = -1
        # The last allocation join and what it was made from (listing, index generation, GPUs,
        # allocatable ids).
        self._joined: tuple[Any, int, tuple[Any, ...], Any, tuple[AllocationRow, ...]] | None = None
        self._user_name = user_name
        self._users: dict[int, str] = {}
        self._on_close = on_close
        self._host_pids_visible = True
        # pid -> (the ProcInfo and index generation it was derived from, its workload)
        self._workloads: dict[int, tuple[ProcInfo, int, Workload]] = {}
        self._warned_host_pids = False
        # The last answer, with the lookup and the index generation it was made from: while
        # both are the same, so is the answer (`resolve`).
        self._settled: tuple[Mapping[int, ProcInfo | None], int, dict[int, Workload]] | None = None

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        """Each PID's owner. The same processes (the cache's very same answer) under the
        same pod index get the last answer again, the same mapping: most passes."""
        pids = list(pids)
        infos = self.cache.lookup(pids)
        settled = self._settled
        if settled is not None and settled[0] is infos and settled[1] == self.index.generation:
            return settled[2]
        missing = [pid for pid, info in infos.items() if info is None]
        if pids:
            self._host_pids_visible = len(missing) < len(pids)
            if not self._host_pids_visible and not self._warned_host_pids:
                self._warned_host_pids = True
                log.warning("none of the %d GPU process(es) (e.g. PID %d) exist under %s: the agent does not see "
                            "the host's PIDs, so GPU processes cannot be attributed to pods; %s",
                            len(pids), pids[0], self.procfs.root, HOST_PID_HINT)
        generation = self.index.generation
        result: dict[int, Workload] = {}
        known: dict[int, tuple[ProcInfo, int, Workload]] = {}
        for pid, info in infos.items():
            if info is None:
                result[pid] = UNKNOWN
                continue
            cached = self._workloads.get(pid)
            if cached is not None and cached[0] is info and cached[1] == generation:
                workload = cached[2]
            else:  # new process, reused PID, or pod metadata changed since
                workload = self.workload(info)
            known[pid] = (info, generation, workload)
            result[pid] = workload
        named = self.fallback is None or self._fill_in(known, result)
        self._workloads = known
        # keep the shared container workloads of live processes only
        self._containers = {(info.cgroup.pod_uid, info.cgroup.container_id): workload
                            for info, _, workload in known.values() if info.cgroup.kind == cgroups.KUBERNETES}
        # With a container left unnamed the fallback is asked again next pass.
        self._settled = (infos, generation, result) if named else None
        return result

    def _fill_in(self, known: dict[int, tuple[ProcInfo, int, Workload]], result: dict[int, Workload]) -> bool:
        """Ask the fallback about containers without names; rejoin them if it knew them.
        True when no container was left without a name."""
        unnamed = {w.container_id for w in result.values()
                   if w.kind in ("kubernetes", "unknown") and w.container_id and not (w.pod and w.container)}
        if not self.fallback.missing(unnamed):
            return not unnamed
        generation = self.index.generation
        for pid, (info, _, workload) in known.items():
            if workload.container_id in unnamed:
                workload = self.workload(info)
                known[pid] = (info, generation, workload)
                result[pid] = workload
        return False

    def workload(self, info: ProcInfo | None) -> Workload:
        """The owner of one process (pure apart from the index and user lookups)."""
        if info is None:
            return UNKNOWN
        owner = info.cgroup
        if owner.kind == cgroups.KUBERNETES:
            if self._containers_generation != self.index.generation:
                self._containers, self._containers_generation = {}, self.index.generation
            key = (owner.pod_uid, owner.container_id)
            shared = self._containers.get(key)
            if shared is None:
                shared = self._containers[key] = self._kubernetes_workload(owner)
            return shared
        if owner.kind == cgroups.SLURM:
            env = info.slurm_env
            user = env.get("SLURM_JOB_USER", "")
            if not user:
                uid_text = owner.slurm_uid
                uid = int(uid_text) if uid_text.isdigit() else info.uid
                user = self._user(uid) if uid is not None else ""
            job_id = owner.slurm_job_id or env.get("SLURM_JOB_ID", "")
            training_job, training_rank = training.from_slurm(job_id, env)
            return Workload(kind="slurm", slurm_job_id=job_id, slurm_step=owner.slurm_step, slurm_user=user,
                            slurm_partition=env.get("SLURM_JOB_PARTITION", ""),
                            slurm_account=env.get("SLURM_JOB_ACCOUNT", ""),
                            training_job=training_job, training_rank=training_rank)
        if owner.kind == cgroups.DOCKER:
            return Workload(kind="docker", container_id=owner.container_id)
        if owner.kind == cgroups.SYSTEMD:
            return Workload(kind="systemd", unit=owner.unit)
        if owner.kind == cgroups.HOST:
            return HOST
        return UNKNOWN

    def _kubernetes_workload(self, owner: Any) -> Workload:
        """A container's `Workload` from the pod index (UID and container id only when unknown)."""
        pod = self.index.get(owner.pod_uid) if owner.pod_uid else None
        if pod is None and owner.container_id:
            pod = self.index.by_container(owner.container_id)
        if pod is None:
            if not owner.pod_uid:  # no pod cgroup and no source knows the id (yet)
                return Workload(kind=UNKNOWN.kind, container_id=owner.container_id)
            return Workload(kind="kubernetes", pod_uid=owner.pod_uid, container_id=owner.container_id)
        return Workload(kind="kubernetes", namespace=pod.namespace, pod=pod.name,
                        container=pod.containers.get(owner.container_id, ""), pod_uid=pod.uid,
                        container_id=owner.container_id, owner_kind=pod.owner_kind, owner_name=pod.owner_name,
                        labels=pod.labels, training_job=pod.training_job, training_rank=pod.training_rank)

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            name = self._users[uid] = self._user_name(uid)
        return name

    def comm(self, pid: int) -> str:
        return self.cache.comm(pid)

    @property
    def generation(self) -> int:
        """Changes whenever the processes cached change (`comm`, `start_time`)."""
        return self.cache.generation

    def start_time(self, pid: int) -> float | None:
        """When the process started, seconds since boot (None where unknown)."""
        return self.cache.start_seconds(pid)

    def allocations(self, devices: Sequence[DeviceSample]) -> tuple[AllocationRow, ...] | None:
        """The kubelet's device allocations joined to this pass's GPUs (None when unknown).

        Reads the source's last listing only: never waits on the kubelet.
        """
        if self.allocation_source is None:
            return None
        listed = self.allocation_source.allocations()
        if listed is None:
            return None
        allocatable_of = getattr(self.allocation_source, "allocatable", None)
        allocatable = allocatable_of() if allocatable_of is not None else None
        gpus = tuple((d.key, d.uuid, d.gpu_instance, d.pci_bus_id, d.serial) for d in devices)
        joined = self._joined
        if (joined is not None and joined[0] is listed and joined[1] == self.index.generation and joined[2] == gpus
                and joined[3] is allocatable):
            return joined[4]  # same listing, same pods, same GPUs, same replicas: same rows
        rows, unknown = podresources.join(listed, devices, self.index, allocatable)
        self._joined = (listed, self.index.generation, gpus, allocatable, rows)
        if unknown != self.unknown_device_ids:
            self.unknown_device_ids = unknown
            if unknown:
                log.debug("%d allocated device id(s) name no GPU on this node (other device plugins' devices, "
                          "or GPUs the agent cannot see): %s", len(unknown), ", ".join(sorted(set(unknown))[:10]))
        return rows

    def statuses(self) -> Mapping[str, bool]:
        statuses = {} if self.pod_source is None else {"kubernetes": bool(self.pod_source.healthy())}
        if self.fallback is not None:
            statuses["cri"] = bool(self.fallback.healthy())
        if self.allocation_source is not None:
            statuses["pod_resources"] = bool(self.allocation_source.healthy())
        return statuses

    def info(self) -> Mapping[str, float]:
        return {"host_pids_visible": 1.0 if self._host_pids_visible else 0.0}

    def close(self) -> None:
        self.cache.close()
        if self.pod_source is not None:
            self.pod_source.stop()
        if self.fallback is not None:
            self.fallback.stop()
        if self.allocation_source is not None:
            self.allocation_source.stop()
        if self._on_close is not None:
            self._on_close()
