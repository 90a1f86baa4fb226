"""GPU time is conserved: per GPU and pass, the holders' allocation seconds plus the GPU's
unallocated seconds equal its capacity seconds (plain values, no clock, no I/O)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_derive import GIB, pod

from exporter.collect.derive import DeriveState, step
from exporter.collect.splits import split_time
from exporter.core.model import AllocationRow, DeviceSample, ProcessSample, Workload


def gpu(procs=(), index=0, uuid=None, capacity=1.0, up=True, gpu_instance=""):
    return DeviceSample(index=index, uuid=uuid or f"GPU-{index}", model="H100", energy_joules=0.0,
                        processes=tuple(procs), up=up, capacity=capacity, gpu_instance=gpu_instance)


def replica(workload, n, replicas=4, key="GPU-0"):
    return AllocationRow(key, workload, "nvidia.com/gpu", f"{key}::{n}", replicas)


def shares(derived):
    return {u.workload.pod or u.workload.slurm_job_id: u.allocation_seconds_total for u in derived.workloads}


def run(devices_per_pass, owners, allocations=None, dt=10.0):
    state = DeriveState()
    derived = None
    for n, devices in enumerate(devices_per_pass):
        state, derived = step(state, n * dt, "n", devices, owners, allocations=allocations)
    return state, derived


# ---- the rules, by hand ------------------------------------------------------------

def test_no_device_plugin_holders_split_by_memory_and_nobody_is_billed_twice():
    assert split_time([(0, 6 * GIB), (0, 2 * GIB)], None) == ([0.75, 0.25], 0.0)


def test_where_no_memory_is_reported_holders_count_the_same():
    assert split_time([(0, None), (0, None), (0, None)], None) == ([1 / 3, 1 / 3, 1 / 3], 0.0)


def test_replicas_k_of_n_and_free_replicas_unallocated():
    parts, free = split_time([(2, 0), (1, 70 * GIB)], 4)
    assert parts == [0.5, 0.25] and free == 0.25


def test_without_allocatable_the_held_replicas_are_all_there_are():
    parts, free = split_time([(1, GIB), (3, GIB)], None)
    assert parts == [0.25, 0.75] and free == 0.0


def test_a_holder_outside_the_device_plugin_takes_its_memory_share_first():
    # four pods on replicas 1 of 5 each, and a Slurm job holding 1.5 of the 78.5 GiB held
    holders = [(1, 70 * GIB), (1, 2 * GIB), (1, 1 * GIB), (1, 3 * GIB), (0, int(1.5 * GIB))]
    parts, free = split_time(holders, 5)
    job = 1.5 / 77.5
    assert parts[4] == pytest.approx(job)
    assert parts[:4] == pytest.approx([(1 - job) / 5] * 4)
    assert free == pytest.approx((1 - job) / 5)
    assert sum(parts) + free == pytest.approx(1.0)


def test_no_holder_means_the_whole_gpu_is_unallocated():
    assert split_time([], 4) == ([], 1.0)


# ---- through step --------------------------------------------------------------------

def test_time_shared_gpu_bills_one_gpu_second_per_second_in_all():
    a, b, c, d = pod("a"), pod("b"), pod("c"), pod("d")
    job = Workload(kind="slurm", slurm_job_id="4242")
    procs = [ProcessSample(1, 70 * GIB, 0.0), ProcessSample(2, 2 * GIB, 0.4), ProcessSample(3, 1 * GIB, 0.2),
             ProcessSample(4, 3 * GIB, 0.1), ProcessSample(5, int(1.5 * GIB), 0.05)]
    owners = {1: a, 2: b, 3: c, 4: d, 5: job}
    allocations = [replica(w, n, replicas=4) for n, w in enumerate((a, b, c, d))]
    _, derived = run([[gpu(procs)]] * 7, owners, allocations)  # 60 s
    s = shares(derived)
    job_share = 1.5 / 77.5
    assert s["4242"] == pytest.approx(60 * job_share)
    for name in "abcd":
        assert s[name] == pytest.approx(60 * (1 - job_share) / 4)
    assert sum(s.values()) == pytest.approx(60.0)
    assert derived.unattributed[0].unallocated_seconds_total == pytest.approx(0.0, abs=1e-9)
    assert derived.device_capacity_seconds["GPU-0"] == pytest.approx(60.0)


def test_a_pod_with_two_of_four_replicas_pays_half_and_the_free_one_is_unallocated():
    a, b = pod("a"), pod("b")
    procs = [ProcessSample(1, 4 * GIB, 0.5), ProcessSample(2, 1 * GIB, 0.5)]
    allocations = [replica(a, 0), replica(a, 1), replica(b, 2)]
    _, derived = run([[gpu(procs)]] * 2, {1: a, 2: b}, allocations)
    assert shares(derived) == pytest.approx({"a": 5.0, "b": 2.5})
    assert derived.unattributed[0].unallocated_seconds_total == pytest.approx(2.5)


def test_waste_is_share_minus_what_it_computed():
    """Usage stays SM time: a pod with a quarter of the GPU that computes 10% wastes 15%."""
    a = pod("a")
    _, derived = run([[gpu([ProcessSample(1, GIB, 0.1)])]] * 2, {1: a}, [replica(a, 0)])
    usage = derived.workloads[0]
    assert usage.allocation_seconds_total == pytest.approx(2.5)
    assert usage.usage_seconds_total == pytest.approx(1.0)


def test_mig_instances_are_their_slices_of_the_gpu_and_the_rest_is_unallocated():
    """A 7-slice GPU with a 3g instance held by a pod and a 1g instance held by nobody: the
    parent carries the 3 slices in no instance."""
    a = pod("a")
    parent = gpu(uuid="GPU-0", capacity=3 / 7)
    held = gpu([ProcessSample(1, 10 * GIB, None)], uuid="MIG-a", capacity=3 / 7, gpu_instance="1")
    free = gpu(uuid="MIG-b", capacity=1 / 7, gpu_instance="2")
    mig_row = AllocationRow("MIG-a", a, "nvidia.com/mig-3g.40gb", "MIG-a", 1)
    _, derived = run([[parent, held, free]] * 2, {1: a}, [mig_row], dt=7.0)
    assert shares(derived) == pytest.approx({"a": 3.0})
    capacity = derived.device_capacity_seconds
    assert capacity == pytest.approx({"GPU-0": 3.0, "MIG-a": 3.0, "MIG-b": 1.0})
    unallocated = {u.device_key: u.unallocated_seconds_total for u in derived.unattributed}
    assert unallocated == pytest.approx({"GPU-0": 3.0, "MIG-a": 0.0, "MIG-b": 1.0})


def test_a_gpu_that_is_down_is_held_by_nobody_and_still_counts_as_capacity():
    a = pod("a")
    procs = [ProcessSample(1, GIB, 0.5)]
    state, _ = step(DeriveState(), 0.0, "n", [gpu(procs)], {1: a})
    state, d = step(state, 10.0, "n", [gpu(procs)], {1: a})
    state, d = step(state, 15.0, "n", [gpu(procs, up=False)], {1: a})
    assert d.device_capacity_seconds["GPU-0"] == pytest.approx(15.0)
    assert d.unattributed[0].unallocated_seconds_total == pytest.approx(5.0)
    assert d.workloads[0].allocation_seconds_total == pytest.approx(10.0)


def test_unattributed_processes_hold_nothing_and_their_gpu_time_is_unallocated():
    host = Workload(kind="host")
    _, derived = run([[gpu([ProcessSample(1, GIB, 0.3)])]] * 2, {1: host})
    assert derived.workloads == ()
    assert derived.unattributed[0].unallocated_seconds_total == pytest.approx(10.0)


# ---- the invariant, on random nodes ------------------------------------------------

holder = st.tuples(
    st.integers(0, 5),                                       # which pod (or 5: a Slurm job, 4: host)
    st.one_of(st.none(), st.integers(0, 16 * GIB)),          # memory
    st.one_of(st.none(), st.floats(0, 1)),                   # SM share
)
gpu_pass = st.tuples(
    st.lists(holder, max_size=6),                            # processes
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 7)), max_size=8),  # (pod, replica id)
    st.one_of(st.none(), st.integers(1, 8)),                 # allocatable replicas
    st.booleans(),                                           # allocations known
    st.booleans(),                                           # up
)


def _owners():
    owners = {i: pod(f"p{i}") for i in range(4)}
    owners[5] = Workload(kind="slurm", slurm_job_id="7")
    owners[4] = Workload(kind="host")
    return owners


@given(passes=st.lists(st.lists(gpu_pass, min_size=1, max_size=3), min_size=1, max_size=6),
       mig=st.booleans(), dts=st.lists(st.floats(0.1, 30), min_size=6, max_size=6))
@settings(max_examples=300, deadline=None)
def test_per_gpu_holders_plus_unallocated_equal_capacity(passes, mig, dts):
    """Random holders, replicas, MIG splits and churn (holders come and go between passes)."""
    owner_of = _owners()
    state = DeriveState()
    now = 0.0
    elapsed = 0.0
    for n, gpus in enumerate(passes):
        devices = []
        owners = {}
        allocations: list[AllocationRow] = []
        known = True
        slices = [1.0] if not mig else [3 / 7, 2 / 7, 1 / 7, 1 / 7][:len(gpus)]
        for g, (procs, replicas, allocatable, allocations_known, up) in enumerate(gpus):
            key = f"GPU-{g}"
            pid_samples = []
            for i, (who, memory, sm) in enumerate(procs):
                pid = 1000 * (g + 1) + i
                owners[pid] = owner_of[who]
                pid_samples.append(ProcessSample(pid, memory, sm))
            capacity = slices[g] if g < len(slices) else 0.0
            devices.append(DeviceSample(index=g, uuid=key, energy_joules=0.0, processes=tuple(pid_samples),
                                        up=up, capacity=capacity))
            known = known and allocations_known
            for who, r in replicas:
                allocations.append(AllocationRow(key, owner_of[who], "nvidia.com/gpu", f"{key}::{r}", allocatable))
        state_before = state
        state, derived = step(state, now, "n", devices, owners, allocations=allocations if known else None)
        # conservation per device: what this pass added
        for device in devices:
            key = device.key
            added_capacity = derived.device_capacity_seconds[key] - state_before.capacity.get(key, 0.0)
            added_unallocated = state.unallocated[key] - state_before.unallocated.get(key, 0.0)
            added_allocated = sum(
                c.allocation_seconds - state_before.workloads.get(wkey, _ZERO).allocation_seconds
                for wkey, c in state.workloads.items() if wkey[0] == key)
            assert added_unallocated >= -1e-9
            assert added_allocated + added_unallocated == pytest.approx(added_capacity, rel=1e-9, abs=1e-9)
        expected = sum(d.capacity for d in devices) * (now - elapsed if n else 0.0)
        assert sum(derived.device_capacity_seconds[d.key] - state_before.capacity.get(d.key, 0.0)
                   for d in devices) == pytest.approx(expected, abs=1e-9)
        elapsed = now
        now += dts[n]


class _Zero:
    allocation_seconds = 0.0


_ZERO = _Zero()
