"""Whose SM share is read how (`exporter.core.shares`), pass by pass.

The per-process samples of a GPU cost more than the rest of its pass, so a GPU held by one
owner takes its owner's share from the device's utilisation, and a GPU that several owners
share has its samples read every `SHARED_READ_PERIOD` seconds, each GPU in its own phase,
its shares carried from the last read in between. Everything here is pure: the tests play
the collector's part (the plan kept from one pass to the next) and the backend's (samples
read only where the plan says). The collector and the NVML backend doing it together are
in tests/test_process_shares.py.
"""

from __future__ import annotations

from typing import Mapping

import pytest

from exporter.core.labels import label_schema
from exporter.core.model import DeviceSample, ProcessSample, Workload
from exporter.core.shares import (
    READ_ALL,
    SHARED_READ_PERIOD,
    LastRead,
    PassPlan,
    carry_shares,
    passes_between_reads,
    plan_shares,
    share_from_device,
)

GiB = 2**30
_, LABELLER = label_schema([])
TRAIN = Workload(kind="kubernetes", namespace="ml", pod="train-a", container="main")
EVAL = Workload(kind="kubernetes", namespace="ml", pod="eval-b", container="main")
TWO_OWNERS: Mapping[int, Workload] = {1: TRAIN, 2: EVAL}


def gpu(util: float | None, *procs: ProcessSample, index: int = 0, **fields: object) -> DeviceSample:
    return DeviceSample(index=index, uuid=f"GPU-{index}", model="m", utilization=util, processes=procs,
                        **fields)  # type: ignore[arg-type]


def shared_gpu(plan: PassPlan, util: float = 0.8, index: int = 0) -> DeviceSample:
    """A GPU of ``train-a`` (PID 1, 60 % of its SM time) and ``eval-b`` (PID 2, 20 %), as a
    backend reads it under ``plan``: with the per-process samples only where it says."""
    if plan.reads_shares(index):
        return gpu(util, ProcessSample(1, GiB, 0.6, 0.3), ProcessSample(2, GiB, 0.2, 0.1), index=index)
    return gpu(util, ProcessSample(1, GiB), ProcessSample(2, GiB), index=index)


# ---- the period and the phase of the reads ----------------------------------------------------


def test_a_read_period_is_a_whole_number_of_passes_and_at_least_one() -> None:
    assert SHARED_READ_PERIOD == 5.0
    assert passes_between_reads(1.0) == 5
    assert passes_between_reads(0.25) == 20
    assert passes_between_reads(3.0) == 2  # 5 s / 3 s, rounded
    assert passes_between_reads(10.0) == 1  # passes longer than the period: every pass
    assert passes_between_reads(0.0) == 1
    assert passes_between_reads(1.0, period=15.0) == 15


def test_a_shared_gpu_is_due_once_every_few_passes_each_gpu_in_its_own_phase() -> None:
    every = 5
    due = {index: [seq for seq in range(2 * every) if PassPlan(every=every, seq=seq).due(index)]
           for index in range(every)}
    assert due[0] == [0, 5] and due[1] == [4, 9] and due[4] == [1, 6]
    assert all(later - first == every for first, later in due.values())
    assert sorted(first for first, _ in due.values()) == list(range(every))  # one GPU per pass
    assert all(PassPlan(every=1, seq=seq).due(3) for seq in range(every))


def test_what_a_pass_reads_of_each_gpus_samples() -> None:
    assert READ_ALL.process_metrics and all(READ_ALL.reads_shares(index) for index in range(8))
    plan = PassPlan(process_metrics=False, shared=frozenset({2}))
    assert [plan.reads_shares(index) for index in range(4)] == [False, False, True, False]


# ---- one pass's decision ------------------------------------------------------------------------


def test_with_every_sample_read_nothing_is_decided() -> None:
    devices = [shared_gpu(READ_ALL)]
    decided = plan_shares(devices, TWO_OWNERS, LABELLER, READ_ALL)
    assert decided.devices == tuple(devices) and decided.read_now == () and decided.next_plan is READ_ALL


def test_a_single_owner_gpu_takes_its_share_from_the_device() -> None:
    alone = gpu(0.73, ProcessSample(1, GiB))
    assert [p.sm_utilization for p in share_from_device(alone).processes] == [0.73]
    assert share_from_device(alone).sm_share_from_device
    # two processes of one owner: the owner's share is the device's, the processes' unknown
    two = gpu(0.73, ProcessSample(1, GiB), ProcessSample(3, GiB))
    decided = plan_shares([two], {1: TRAIN, 3: TRAIN}, LABELLER, PassPlan(process_metrics=False))
    (device,) = decided.devices
    assert device.sm_share_from_device and [p.sm_utilization for p in device.processes] == [None, None]
    assert decided.read_now == () and decided.next_plan.shared == frozenset() and not decided.next_plan.carried


def test_a_gpu_a_second_owner_has_just_joined_is_read_now_and_in_the_next_pass() -> None:
    plan = PassPlan(process_metrics=False, every=5, seq=7)
    decided = plan_shares([shared_gpu(plan)], TWO_OWNERS, LABELLER, plan)
    assert decided.read_now == (0,)
    assert not decided.devices[0].sm_share_from_device
    assert decided.next_plan == PassPlan(process_metrics=False, shared=frozenset({0}), every=5, seq=8)


def test_down_gpus_mig_instances_and_gpus_without_processes_are_left_as_they_are() -> None:
    plan = PassPlan(process_metrics=False)
    devices = [gpu(0.5, ProcessSample(1), ProcessSample(2), index=0, up=False, error="GPU is lost"),
               gpu(0.5, ProcessSample(1), ProcessSample(2), index=1, gpu_instance="1"),
               gpu(0.5, index=2)]
    decided = plan_shares(devices, TWO_OWNERS, LABELLER, plan)
    assert decided.devices == tuple(devices) and decided.read_now == ()
    assert decided.next_plan.shared == frozenset() and not decided.next_plan.carried


# ---- pass after pass ----------------------------------------------------------------------------


def run(passes: int, every: int, gpus: int = 1, util: float = 0.8) -> list[list[int]]:
    """Per GPU, the passes in which its per-process samples are read (in its part of the
    pass, or at once after the owners are known), ``gpus`` GPUs shared all along."""
    plan = PassPlan(process_metrics=False, every=every)
    reads: list[list[int]] = [[] for _ in range(gpus)]
    for seq in range(passes):
        devices = [shared_gpu(plan, util, index) for index in range(gpus)]
        decided = plan_shares(devices, TWO_OWNERS, LABELLER, plan)
        for index in range(gpus):
            if plan.reads_shares(index) or index in decided.read_now:
                reads[index].append(seq)
        plan = decided.next_plan
    return reads


def test_a_shared_gpu_is_read_at_once_then_once_every_period() -> None:
    every = passes_between_reads(1.0)
    (reads,) = run(4 * every, every)
    # found shared (read at once), read again in the next pass's own part (the schedule
    # starts), then once every `every` passes
    assert reads == [0, 1, every, 2 * every, 3 * every]


def test_the_reads_of_several_shared_gpus_fall_in_different_passes() -> None:
    every = 5
    reads = run(3 * every, every, gpus=3)
    scheduled = [set(r[2:]) for r in reads]  # after the two reads that start each schedule
    assert all(len(s) >= 2 and all(b - a == every for a, b in zip(sorted(s), sorted(s)[1:])) for s in scheduled)
    assert not (scheduled[0] & scheduled[1] or scheduled[0] & scheduled[2] or scheduled[1] & scheduled[2])


def test_between_reads_the_shares_are_carried_scaled_by_the_gpus_utilisation() -> None:
    plan = PassPlan(process_metrics=False, every=5)
    for _ in range(2):  # found shared, then read in its own part at 80 %
        decided = plan_shares([shared_gpu(plan, 0.8)], TWO_OWNERS, LABELLER, plan)
        plan = decided.next_plan
    assert 0 in plan.carried and not plan.reads_shares(0)
    decided = plan_shares([shared_gpu(plan, 0.4)], TWO_OWNERS, LABELLER, plan)
    assert decided.read_now == ()
    assert [p.sm_utilization for p in decided.devices[0].processes] == [pytest.approx(0.3), pytest.approx(0.1)]
    assert decided.next_plan.carried[0] is plan.carried[0]  # carried from the same read


def test_a_gpu_whose_processes_changed_since_its_read_is_read_at_once() -> None:
    plan = PassPlan(process_metrics=False, every=5)
    for _ in range(2):
        plan = plan_shares([shared_gpu(plan)], TWO_OWNERS, LABELLER, plan).next_plan
    assert 0 in plan.carried
    joined = gpu(0.8, ProcessSample(1, GiB), ProcessSample(2, GiB), ProcessSample(4, GiB))
    decided = plan_shares([joined], {**TWO_OWNERS, 4: EVAL}, LABELLER, plan)
    assert decided.read_now == (0,) and 0 in decided.next_plan.shared


def test_a_gpu_back_to_one_owner_takes_its_share_from_the_device_again() -> None:
    plan = PassPlan(process_metrics=False, every=5)
    for _ in range(2):
        plan = plan_shares([shared_gpu(plan)], TWO_OWNERS, LABELLER, plan).next_plan
    decided = plan_shares([gpu(0.5, ProcessSample(1, GiB))], TWO_OWNERS, LABELLER, plan)
    assert decided.read_now == () and decided.devices[0].sm_share_from_device
    assert decided.devices[0].processes[0].sm_utilization == 0.5
    assert decided.next_plan.shared == frozenset() and not decided.next_plan.carried


def test_carried_shares_follow_the_gpus_utilisation_and_a_changed_gpu_is_read_again():
    """Between two reads of a shared GPU, each process keeps its share of the last read
    scaled by the GPU's utilisation since; what cannot be carried is read now."""
    read = LastRead.of(gpu(0.8, ProcessSample(1, GiB, 0.6, 0.3), ProcessSample(2, GiB, 0.2, 0.1)))
    assert read is not None
    now = carry_shares(gpu(0.4, ProcessSample(1, 2 * GiB), ProcessSample(2, GiB)), read)
    assert now is not None
    assert [(p.pid, p.used_memory_bytes, p.sm_utilization, p.memory_utilization) for p in now.processes] == [
        (1, 2 * GiB, pytest.approx(0.3), 0.3), (2, GiB, pytest.approx(0.1), 0.1)]
    # never more than the whole GPU
    full = carry_shares(gpu(1.0, ProcessSample(1), ProcessSample(2)), LastRead.of(
        gpu(0.5, ProcessSample(1, None, 0.45), ProcessSample(2, None, 0.05))))
    assert full is not None and [p.sm_utilization for p in full.processes] == [pytest.approx(0.9), 1.0 * 0.1]
    # a process came or went, the utilisation is unknown, or an idle GPU got busy: read now
    assert carry_shares(gpu(0.4, ProcessSample(1)), read) is None
    assert carry_shares(gpu(0.4, ProcessSample(1), ProcessSample(3)), read) is None
    assert carry_shares(gpu(None, ProcessSample(1), ProcessSample(2)), read) is None
    idle = LastRead.of(gpu(0.0, ProcessSample(1, None, 0.0), ProcessSample(2, None, 0.0)))
    assert idle is not None
    assert carry_shares(gpu(0.3, ProcessSample(1), ProcessSample(2)), idle) is None
    still = carry_shares(gpu(0.0, ProcessSample(1), ProcessSample(2)), idle)
    assert still is not None and [p.sm_utilization for p in still.processes] == [0.0, 0.0]
    # a device that cannot sample its processes has nothing to carry
    assert LastRead.of(gpu(0.5, ProcessSample(1))) is None
