"""Device allocations (kubelet pod-resources) in the derived counters, with plain values."""

import pytest
from test_derive import GIB, gpu, pod

from exporter.collect.derive import DeriveState, step
from exporter.core.model import AllocationRow, ProcessSample, Workload


def alloc(workload, index=0, device_id=None):
    return AllocationRow(f"GPU-{index}", workload, "nvidia.com/gpu", device_id or f"GPU-{index}")


def rows(derived):
    return {u.workload.pod: u for u in derived.workloads}


def test_allocated_and_unused_is_a_workload_with_honest_zeros_idle_from_allocation():
    reserved = pod("reserved")
    state, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0)], {}, allocations=[alloc(reserved)])
    r = rows(d)["reserved"]
    assert (r.allocated, r.processes, r.memory_used_bytes, r.utilization) == (True, 0, 0, 0.0)
    assert (r.idle_seconds, r.allocation_seconds_total, r.energy_joules_total) == (0.0, 0.0, 0.0)
    assert r.usage_seconds_total is None  # absent until a process reports an SM share
    state, d = step(state, 10.0, "n", [gpu(energy=720.0)], {}, allocations=[alloc(reserved)])
    r = rows(d)["reserved"]
    assert r.idle_seconds == 10.0 and r.allocation_seconds_total == 10.0
    assert r.energy_joules_total == 0.0  # no process, no memory: no share of the energy
    assert d.unattributed[0].energy_joules_total == pytest.approx(720.0)  # conservation
    assert d.unattributed[0].memory_used_bytes == 0
    state, d = step(state, 25.0, "n", [gpu(energy=800.0)], {}, allocations=[alloc(reserved)])
    assert rows(d)["reserved"].idle_seconds == 25.0 and rows(d)["reserved"].allocation_seconds_total == 25.0


def test_a_process_of_an_allocated_container_joins_the_same_series():
    train = pod("train", owner_kind="Job", owner_name="train")
    # the allocation's Workload is another object with the same identity (built from the index)
    allocated = Workload(kind="kubernetes", namespace="team-a", pod="train", container="main", pod_uid="uid-train",
                         owner_kind="Job", owner_name="train")
    procs = [ProcessSample(1, 4 * GIB, 0.0)]
    state, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs)], {1: train},
                    allocations=[alloc(allocated)])
    assert len(d.workloads) == 1
    r = d.workloads[0]
    assert (r.allocated, r.processes, r.memory_used_bytes) == (True, 1, 4 * GIB)
    # computing: not idle; stops computing and frees its memory: allocated, so idle again
    procs = [ProcessSample(1, 4 * GIB, 0.9)]
    state, d = step(state, 5.0, "n", [gpu(energy=500.0, procs=procs)], {1: train}, allocations=[alloc(allocated)])
    assert d.workloads[0].idle_seconds == 0.0 and d.workloads[0].usage_seconds_total == pytest.approx(4.5)
    procs = [ProcessSample(1, 0, 0.0)]
    state, d = step(state, 10.0, "n", [gpu(energy=600.0, procs=procs)], {1: train}, allocations=[alloc(allocated)])
    state, d = step(state, 14.0, "n", [gpu(energy=700.0, procs=procs)], {1: train}, allocations=[alloc(allocated)])
    r = d.workloads[0]
    assert r.idle_seconds == 4.0 and r.allocation_seconds_total == pytest.approx(14.0)
    # without the allocation, the same process holding no memory neither idles nor holds the GPU
    state, d = step(state, 20.0, "n", [gpu(energy=800.0, procs=procs)], {1: train}, allocations=[])
    r = d.workloads[0]
    assert (r.allocated, r.idle_seconds, r.allocation_seconds_total) == (False, 0.0, pytest.approx(14.0))


def test_time_sliced_gpu_gives_one_series_per_container_and_conserves_energy():
    a, b, c = pod("a"), pod("b"), pod("c")
    procs = [ProcessSample(1, 2 * GIB, 0.5)]
    allocations = [alloc(a, device_id="GPU-0::0"), alloc(b, device_id="GPU-0::1"), alloc(c, device_id="GPU-0::2"),
                   alloc(c, device_id="GPU-0::3")]  # two replicas to one container: still one series
    state, _ = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs)], {1: a}, allocations=allocations)
    state, d = step(state, 10.0, "n", [gpu(energy=1000.0, procs=procs)], {1: a}, allocations=allocations)
    r = rows(d)
    assert sorted(r) == ["a", "b", "c"] and all(u.allocated for u in r.values())
    assert [r[k].processes for k in "abc"] == [1, 0, 0]
    assert r["a"].energy_joules_total == pytest.approx(1000.0)  # the only memory holder takes the idle part too
    assert r["b"].energy_joules_total == r["c"].energy_joules_total == 0.0
    total = sum(u.energy_joules_total for u in r.values()) + d.unattributed[0].energy_joules_total
    assert total == pytest.approx(1000.0)
    memory = sum(u.memory_used_bytes for u in r.values()) + d.unattributed[0].memory_used_bytes
    assert memory == 2 * GIB


def test_allocated_is_unknown_without_allocations_and_for_slurm_jobs():
    job = Workload(kind="slurm", slurm_job_id="42")
    procs = [ProcessSample(1, GIB, 0.1), ProcessSample(2, GIB, 0.1)]
    owners = {1: pod("a"), 2: job}
    _, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs)], owners)
    assert [u.allocated for u in d.workloads] == [None, None]
    _, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs)], owners, allocations=[])
    by_kind = {u.workload.pod or "slurm": u.allocated for u in d.workloads}
    assert by_kind == {"a": False, "slurm": None}  # a pod on a GPU it was not allocated: 0
    # a pod known by UID only (no names yet) cannot be matched to pod-resources: unknown
    uid_only = Workload(kind="kubernetes", pod_uid="uid-x", container_id="c" * 64)
    _, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs[:1])], {1: uid_only}, allocations=[])
    assert [u.allocated for u in d.workloads] == [None]


def test_a_released_allocation_keeps_its_counters_for_the_grace_period():
    reserved = pod("reserved")
    state, _ = step(DeriveState(), 0.0, "n", [gpu(energy=0.0)], {}, allocations=[alloc(reserved)])
    state, _ = step(state, 10.0, "n", [gpu(energy=10.0)], {}, allocations=[alloc(reserved)])
    state, d = step(state, 20.0, "n", [gpu(energy=20.0)], {}, allocations=[], grace_seconds=30)
    r = rows(d)["reserved"]
    assert (r.present, r.allocation_seconds_total) == (False, 10.0)
    state, d = step(state, 60.0, "n", [gpu(energy=30.0)], {}, allocations=[], grace_seconds=30)
    assert d.workloads == ()


def test_allocations_on_a_gpu_that_is_down_or_unknown_add_nothing():
    reserved = pod("reserved")
    _, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, up=False)], {},
                allocations=[alloc(reserved), alloc(reserved, index=5)])
    assert d.workloads == ()
