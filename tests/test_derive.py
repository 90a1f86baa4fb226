"""Derived counters and the split rules, with plain values (no clock, no I/O)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.collect.derive import DeriveState, step
from exporter.collect.splits import split_energy
from exporter.core.labels import label_schema, workload_label_map
from exporter.core.model import DeviceSample, ProcessSample, Workload
from exporter.core.process_groups import has_one_owner

GIB = 2**30


def pod(name, ns="team-a", **kw):
    return Workload(kind="kubernetes", namespace=ns, pod=name, container="main", pod_uid=f"uid-{name}", **kw)


def gpu(energy=None, power=None, procs=(), up=True, index=0):
    return DeviceSample(index=index, uuid=f"GPU-{index}", model="H100", energy_joules=energy, power_watts=power,
                        processes=tuple(procs), up=up)


def by_pod(derived):
    return {u.workload.pod: u for u in derived.workloads}


def test_device_energy_counter_follows_device_and_survives_a_reset():
    state = DeriveState()
    state, d = step(state, 0.0, "n", [gpu(energy=1000.0)], {})
    assert d.device_energy_joules["GPU-0"] == 1000.0
    state, d = step(state, 1.0, "n", [gpu(energy=1500.0)], {})
    assert d.device_energy_joules["GPU-0"] == 1500.0
    state, d = step(state, 2.0, "n", [gpu(energy=100.0)], {})  # driver reloaded: counter restarted
    assert d.device_energy_joules["GPU-0"] == 1500.0
    state, d = step(state, 3.0, "n", [gpu(energy=300.0)], {})
    assert d.device_energy_joules["GPU-0"] == 1700.0


def test_energy_integrates_power_when_the_device_has_no_counter():
    state, _ = step(DeriveState(), 0.0, "n", [gpu(power=300.0)], {})
    state, d = step(state, 2.0, "n", [gpu(power=300.0)], {})
    assert d.device_energy_joules["GPU-0"] == pytest.approx(600.0)


def test_time_sliced_pods_get_their_own_honest_numbers():
    procs = [ProcessSample(1, 2 * GIB, 0.5), ProcessSample(2, 1 * GIB, 0.2), ProcessSample(3, 4 * GIB, 0.1)]
    owners = {1: pod("a"), 2: pod("b"), 3: pod("c")}
    state, _ = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs)], owners)
    state, d = step(state, 10.0, "n", [gpu(energy=1000.0, procs=procs)], owners)
    pods = by_pod(d)
    assert {k: v.memory_used_bytes for k, v in pods.items()} == {"a": 2 * GIB, "b": 1 * GIB, "c": 4 * GIB}
    assert {k: v.utilization for k, v in pods.items()} == {"a": 0.5, "b": 0.2, "c": 0.1}
    assert pods["a"].usage_seconds_total == pytest.approx(5.0)
    # No device plugin here: the GPU's 10 s are split by memory held (2:1:4)
    assert {k: v.allocation_seconds_total for k, v in pods.items()} == pytest.approx(
        {"a": 10 * 2 / 7, "b": 10 * 1 / 7, "c": 10 * 4 / 7})
    assert d.unattributed[0].unallocated_seconds_total == pytest.approx(0.0)
    assert d.device_capacity_seconds["GPU-0"] == pytest.approx(10.0)
    # busy = 0.8: 800 J by SM share (5:2:1), 200 J idle by memory share (2:1:4)
    assert pods["a"].energy_joules_total == pytest.approx(500 + 200 * 2 / 7)
    assert pods["b"].energy_joules_total == pytest.approx(200 + 200 * 1 / 7)
    assert pods["c"].energy_joules_total == pytest.approx(100 + 200 * 4 / 7)
    total = sum(p.energy_joules_total for p in pods.values()) + d.unattributed[0].energy_joules_total
    assert total == pytest.approx(1000)


def test_zombie_idle_seconds_grow_and_reset_when_it_computes():
    owners = {7: pod("nb")}
    idle = [ProcessSample(7, 70 * GIB, 0.0)]
    state, d = step(DeriveState(), 100.0, "n", [gpu(procs=idle)], owners)
    assert by_pod(d)["nb"].idle_seconds == 0.0
    state, d = step(state, 160.0, "n", [gpu(procs=idle)], owners)
    assert by_pod(d)["nb"].idle_seconds == 60.0
    state, d = step(state, 161.0, "n", [gpu(procs=[ProcessSample(7, 70 * GIB, 0.3)])], owners)
    assert by_pod(d)["nb"].idle_seconds == 0.0


def test_unattributed_processes_keep_the_totals_honest():
    procs = [ProcessSample(1, 3 * GIB, 0.4), ProcessSample(2, 1 * GIB, 0.4)]
    state, _ = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs)], {1: pod("a")})
    state, d = step(state, 1.0, "n", [gpu(energy=100.0, procs=procs)], {1: pod("a")})
    assert d.unattributed[0].memory_used_bytes == 1 * GIB
    assert d.unattributed[0].processes == 1
    assert d.unattributed_processes == 1
    total = by_pod(d)["a"].energy_joules_total + d.unattributed[0].energy_joules_total
    assert total == pytest.approx(100.0)


def test_a_pod_on_two_gpus_gets_one_series_per_gpu_and_processes_are_summed():
    owners = {1: pod("t"), 2: pod("t"), 3: pod("t")}
    devices = [gpu(index=0, procs=[ProcessSample(1, GIB, 0.3), ProcessSample(2, GIB, 0.3)]),
               gpu(index=1, procs=[ProcessSample(3, GIB, 0.9)])]
    _, d = step(DeriveState(), 0.0, "n", devices, owners)
    rows = sorted((workload_label_map(u.labels)["gpu"], u.processes, u.memory_used_bytes, u.utilization) for u in d.workloads)
    assert rows == [("0", 2, 2 * GIB, 0.6), ("1", 1, GIB, 0.9)]


def test_vanished_workload_keeps_counters_for_the_grace_period_then_goes():
    owners = {1: pod("a")}
    procs = [ProcessSample(1, GIB, 1.0)]
    state, _ = step(DeriveState(), 0.0, "n", [gpu(procs=procs)], owners, grace_seconds=30)
    state, d = step(state, 10.0, "n", [gpu(procs=procs)], owners, grace_seconds=30)
    assert by_pod(d)["a"].usage_seconds_total == 10.0
    state, d = step(state, 20.0, "n", [gpu()], {}, grace_seconds=30)
    gone = by_pod(d)["a"]
    assert not gone.present and gone.usage_seconds_total == 10.0 and gone.processes == 0
    state, d = step(state, 41.0, "n", [gpu()], {}, grace_seconds=30)
    assert "a" not in by_pod(d)


def test_down_device_keeps_energy_but_reports_no_workloads():
    owners = {1: pod("a")}
    state, _ = step(DeriveState(), 0.0, "n", [gpu(energy=10.0, procs=[ProcessSample(1, GIB, 0.5)])], owners)
    state, d = step(state, 1.0, "n", [gpu(up=False)], owners)
    assert d.device_energy_joules["GPU-0"] == 10.0
    assert [u.present for u in d.workloads] == [False]


def test_label_schema_adds_owner_and_pod_labels():
    names, labeller = label_schema(["team", "app.kubernetes.io/name"])
    assert names == ("owner_kind", "owner_name", "slurm_user", "slurm_account", "label_team",
                     "label_app_kubernetes_io_name", "training_job", "training_rank")
    w = pod("a", owner_kind="Deployment", owner_name="web", labels=(("team", "search"),))
    assert labeller(w)[-6:] == ("Deployment", "web", "", "", "search", "")  # no job: no training values
    job = Workload(kind="slurm", slurm_job_id="4242", slurm_user="alice", slurm_account="physics",
                   training_job="4242", training_rank="13")
    assert labeller(job)[-8:] == ("", "", "alice", "physics", "", "", "4242", "13")
    ray = pod("b", training_job="rl-cluster")  # a job without ranks: the job alone
    assert labeller(ray)[-3:] == ("", "", "rl-cluster")


def test_two_ranks_of_one_slurm_job_on_two_gpus_are_each_their_own_workload():
    names, labeller = label_schema([])
    rank = {r: Workload(kind="slurm", slurm_job_id="4242", slurm_step="0", training_job="4242", training_rank=str(r))
            for r in (0, 1)}
    devices = [gpu(index=i, procs=[ProcessSample(10 + i, GIB, 0.5)]) for i in (0, 1)]
    _, d = step(DeriveState(), 0.0, "n", devices, {10: rank[0], 11: rank[1]}, labeller)
    by_gpu = {u.device_key: u for u in d.workloads}
    for i in (0, 1):
        usage = by_gpu[f"GPU-{i}"]
        assert usage.workload.training_rank == str(i)  # the pass's workload is the rank's, not the job's first
        assert workload_label_map(usage.labels, names)["training_rank"] == str(i)


shares = st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 1)), st.one_of(st.none(), st.integers(0, 80 * GIB))),
                  max_size=12)


@given(delta=st.floats(0, 1e6), procs=shares)
@settings(max_examples=300, deadline=None)
def test_energy_split_conserves_the_delta(delta, procs):
    parts, nobody = split_energy(delta, procs)
    assert all(p >= 0 for p in parts) and nobody >= 0
    assert sum(parts) + nobody == pytest.approx(delta, rel=1e-9, abs=1e-6)


@given(procs=st.lists(st.tuples(st.integers(1, 50), st.integers(0, 8 * GIB), st.floats(0, 1)), max_size=10),
       attributed=st.sets(st.integers(1, 50)), energy=st.floats(0, 1e5))
@settings(max_examples=200, deadline=None)
def test_per_gpu_conservation_of_memory_and_energy(procs, attributed, energy):
    unique = {pid: (mem, util) for pid, mem, util in procs}
    samples = [ProcessSample(pid, mem, util) for pid, (mem, util) in unique.items()]
    owners = {pid: pod(f"p{pid % 3}") for pid in unique if pid in attributed}
    state, _ = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=samples)], owners)
    _, d = step(state, 1.0, "n", [gpu(energy=energy, procs=samples)], owners)
    memory = sum(u.memory_used_bytes for u in d.workloads) + d.unattributed[0].memory_used_bytes
    assert memory == sum(m for m, _ in unique.values())
    joules = sum(u.energy_joules_total for u in d.workloads) + d.unattributed[0].energy_joules_total
    assert joules == pytest.approx(energy, rel=1e-9, abs=1e-6)


def test_devices_without_per_process_memory_omit_it_but_still_count_allocation():
    owners = {1: pod("g")}
    procs = [ProcessSample(1, None, None)]  # e.g. Gaudi: processes found, no per-process numbers
    state, _ = step(DeriveState(), 0.0, "n", [gpu(procs=procs)], owners)
    state, d = step(state, 5.0, "n", [gpu(procs=procs)], owners)
    usage = by_pod(d)["g"]
    assert usage.memory_used_bytes is None and usage.utilization is None
    assert usage.allocation_seconds_total == 5.0 and usage.processes == 1
    assert d.unattributed[0].memory_used_bytes == 0


def test_unknown_shares_leave_idle_and_usage_absent_and_holders_share_the_energy():
    """Gaudi: processes on the device, no SM share, no memory. What cannot be told is None;
    the device's energy goes to the processes holding it, equally."""
    owners = {1: pod("g"), 2: pod("h")}
    procs = [ProcessSample(1, None, None), ProcessSample(2, None, None), ProcessSample(3, None, None)]
    state, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=procs)], owners)
    state, d = step(state, 5.0, "n", [gpu(energy=600.0, procs=procs)], owners)
    usage = by_pod(d)["g"]
    assert usage.idle_seconds is None and usage.usage_seconds_total is None
    # no memory reported: the two workloads holding the device split its 5 s equally;
    # process 3 belongs to no workload and is billed nothing
    assert usage.allocation_seconds_total == 2.5 and by_pod(d)["h"].allocation_seconds_total == 2.5
    assert d.unattributed[0].unallocated_seconds_total == 0.0
    assert usage.energy_joules_total == pytest.approx(200.0) and by_pod(d)["h"].energy_joules_total == pytest.approx(200.0)
    assert d.unattributed[0].energy_joules_total == pytest.approx(200.0)  # process 3 belongs to no workload
    # The grace period keeps the counters as they were.
    state, d = step(state, 6.0, "n", [gpu(energy=700.0)], owners)
    gone = by_pod(d)["g"]
    assert not gone.present and gone.usage_seconds_total is None and gone.energy_joules_total == pytest.approx(200.0)
    assert d.unattributed[0].energy_joules_total == pytest.approx(300.0)  # idle with no holder


def test_first_sight_without_sm_share_then_counters_start():
    """AMD: the first pass has memory but no engine-time interval yet; then shares arrive."""
    owners = {1: pod("a")}
    state, d = step(DeriveState(), 0.0, "n", [gpu(energy=0.0, procs=[ProcessSample(1, GIB, None)])], owners)
    first = by_pod(d)["a"]
    assert first.idle_seconds is None and first.usage_seconds_total is None
    assert first.energy_joules_total == 0.0  # memory known: it has an energy share (none used yet)
    state, d = step(state, 10.0, "n", [gpu(energy=100.0, procs=[ProcessSample(1, GIB, 0.0)])], owners)
    later = by_pod(d)["a"]
    assert later.idle_seconds == 0.0 and later.usage_seconds_total == 0.0
    assert later.energy_joules_total == pytest.approx(100.0)  # idle energy split by memory: all of it
    state, d = step(state, 20.0, "n", [gpu(energy=200.0, procs=[ProcessSample(1, GIB, 0.5)])], owners)
    assert by_pod(d)["a"].usage_seconds_total == pytest.approx(5.0)


def shared_from_device(util, procs, energy):
    """A GPU held by one owner whose per-process samples were not read (the collector's
    `share_from_device`): its processes' SM shares unknown, the device's utilisation known."""
    return DeviceSample(index=0, uuid="GPU-0", model="H100", energy_joules=energy, utilization=util,
                        processes=tuple(procs), sm_share_from_device=True)


def test_one_owner_with_its_share_from_the_device_gets_the_same_numbers_as_from_samples():
    a = pod("a")
    owners = {1: a, 2: a}
    from_samples = [ProcessSample(1, 10 * GIB, 0.25), ProcessSample(2, 30 * GIB, 0.35)]
    from_device = [ProcessSample(1, 10 * GIB), ProcessSample(2, 30 * GIB)]
    results = []
    for device in (lambda e: gpu(energy=e, procs=from_samples), lambda e: shared_from_device(0.6, from_device, e)):
        state, _ = step(DeriveState(), 0.0, "n", [device(0.0)], owners)
        state, d = step(state, 10.0, "n", [device(1000.0)], owners)
        (usage,) = d.workloads
        results.append((usage.utilization, usage.usage_seconds_total, usage.energy_joules_total,
                        usage.allocation_seconds_total, usage.idle_seconds, d.unattributed[0].energy_joules_total))
    assert results[1] == pytest.approx(results[0])
    assert results[1] == pytest.approx((0.6, 6.0, 1000.0, 10.0, 0.0, 0.0))


def test_one_owner_idle_by_the_devices_utilisation_and_without_memory_its_idle_energy_unattributed():
    a = pod("a")
    state, _ = step(DeriveState(), 0.0, "n", [shared_from_device(0.0, [ProcessSample(1, 4 * GIB)], 0.0)], {1: a})
    state, d = step(state, 30.0, "n", [shared_from_device(0.0, [ProcessSample(1, 4 * GIB)], 300.0)], {1: a})
    (usage,) = d.workloads
    assert usage.utilization == 0.0 and usage.idle_seconds == 30.0 and usage.energy_joules_total == 300.0
    # Memory not reported (some MIG and Windows setups): busy energy is the owner's, idle
    # energy nobody's, as with per-process samples.
    no_memory = [ProcessSample(1, None), ProcessSample(2, None)]
    state, _ = step(DeriveState(), 0.0, "n", [shared_from_device(0.25, no_memory, 0.0)], {1: a, 2: a})
    state, d = step(state, 1.0, "n", [shared_from_device(0.25, no_memory, 400.0)], {1: a, 2: a})
    (usage,) = d.workloads
    assert usage.energy_joules_total == pytest.approx(100.0)
    assert d.unattributed[0].energy_joules_total == pytest.approx(300.0)


def test_a_usage_carries_its_workload_the_same_object_on_every_gpu_of_a_pass():
    """Fields beyond the labels (a Slurm job's step) come from the workload's first process
    on the node, so every GPU's entry names the same Workload."""
    step0 = Workload(kind="slurm", slurm_job_id="42", slurm_step="0", slurm_user="bob")
    step1 = Workload(kind="slurm", slurm_job_id="42", slurm_step="1", slurm_user="bob")
    devices = [gpu(index=0, procs=[ProcessSample(1, GIB, 0.5)]), gpu(index=1, procs=[ProcessSample(2, GIB, 0.5)])]
    _, d = step(DeriveState(), 0.0, "n", devices, {1: step0, 2: step1}, label_schema([])[1])
    assert [u.workload for u in d.workloads] == [step0, step0]
    assert all(workload_label_map(u.labels)["slurm_job_id"] == "42" for u in d.workloads)


def test_sole_owner_is_the_one_workload_running_every_process_on_an_up_gpu():
    a, b = pod("a"), pod("b")
    devices = [gpu(index=0, procs=[ProcessSample(1, GIB, 0.1), ProcessSample(2, GIB, 0.1)]),  # a alone, 2 processes
               gpu(index=1, procs=[ProcessSample(3, GIB, 0.1), ProcessSample(4, GIB, 0.1)]),  # a and b
               gpu(index=2, procs=[ProcessSample(5, GIB, 0.1), ProcessSample(99, GIB, 0.1)])]  # b and an unknown pid
    owners = {1: a, 2: a, 3: a, 4: b, 5: b}
    state, d = step(DeriveState(), 0.0, "n", devices, owners)
    sole = {(u.device_key, u.workload.pod) for u in d.workloads if u.sole_owner}
    assert sole == {("GPU-0", "a")}
    assert [has_one_owner(device, owners) for device in devices] == [True, False, False]
    assert has_one_owner(gpu(procs=[ProcessSample(98, GIB), ProcessSample(99, GIB)]), owners)  # none attributed
    # a gone workload's counters (grace period) are no owner of anything
    _, d = step(state, 1.0, "n", [gpu(index=0)], owners)
    assert d.workloads and not any(u.present or u.sole_owner for u in d.workloads)


def test_a_gpu_whose_processes_tuple_is_the_last_passes_derives_what_fresh_samples_do():
    """A pass given the very processes tuple of the last one takes what that pass worked
    out for them; its figures are those of the same processes sampled afresh."""
    a, b = pod("a"), pod("b")
    procs = (ProcessSample(1, 2 * GIB, 0.25), ProcessSample(2, GIB, 0.5), ProcessSample(3, 3 * GIB, 0.0))
    owners = {1: a, 2: b, 3: a}
    kept, fresh = DeriveState(), DeriveState()
    for n in range(4):
        same = gpu(energy=100.0 * n + 7.3, procs=procs)
        anew = gpu(energy=100.0 * n + 7.3, procs=tuple(ProcessSample(p.pid, p.used_memory_bytes, p.sm_utilization)
                                                    for p in procs))
        kept, kept_out = step(kept, float(n), "node-1", [same], owners)
        fresh, fresh_out = step(fresh, float(n), "node-1", [anew], owners)
        assert kept_out == fresh_out
