"""PID reuse with real processes in real cgroups: pod A's process raises Xid 31 and exits,
pod B's process gets the same PID, and the kernel-log line, stamped before B's process
started, is read after it. The culprit is A's pod, never B's; a line stamped after B
started is B's. Start times come from the real /proc (the agent's own attribution), the
GPU from a faked NVML reporting the real PIDs, the line from a kmsg-format file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
from cgroup_helpers import Cgroups, burstable_scope, cgroup2_unwritable, container_id, pod_uid, spawn_with_pid

from exporter.attribution import build_attributor
from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.incidents.engine import IncidentConfig, IncidentTracker
from exporter.incidents.kmsg import KernelLog
from exporter.incidents.watch import IncidentWatch

pynvml_fake = pytest.importorskip("fakes.pynvml_fake", reason="the NVML fake is not available")
nvml_backend = pytest.importorskip("exporter.devices.nvml", reason="the NVML backend is not available")

pytestmark = pytest.mark.skipif(bool(cgroup2_unwritable()), reason=cgroup2_unwritable() or "ok")
GiB = 2**30


def _start(pid: int) -> float:
    from exporter.attribution.procfs import CLOCK_TICKS, parse_start_time

    start = parse_start_time(Path(f"/proc/{pid}/stat").read_text())
    assert start is not None
    return start / CLOCK_TICKS


def _line(pid: int, at: float, seq: int) -> str:
    return (f"3,{seq},{int(at * 1e6)},-;NVRM: Xid (PCI:0000:3b:00): 31, pid={pid}, name=python3, Ch 00000008, "
            "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1e_00000000\n")


def test_a_pid_reused_by_another_pod_after_the_fault_never_makes_it_the_culprit(tmp_path: Path,
                                                                                   cgroups: Cgroups) -> None:
    F = pynvml_fake
    uid_a, uid_b, uid_c = pod_uid(), pod_uid(), pod_uid()
    a = cgroups.spawn(burstable_scope(uid_a, container_id()))
    c = cgroups.spawn(burstable_scope(uid_c, container_id()))  # shares the GPU: no sole holder to fall back on
    gpu = F.FakeGpu(processes=[F.FakeProcess(pid=a.pid, used_memory=GiB), F.FakeProcess(pid=c.pid, used_memory=GiB)])
    gpu.bus_id = "00000000:3B:00.0"
    fake = F.FakeNvml(gpus=[gpu])
    backend = nvml_backend.NvmlBackend(nvml=fake, energy_counter_period=0)
    backend.open()
    args = argparse.Namespace(proc_root="/proc", kubernetes="off", pod_label=[])
    attributor = build_attributor(args, "gpu-node-1")
    names, labeller = label_schema([])
    collector = Collector([backend], "gpu-node-1", interval=1.0, attributor=attributor, labeller=labeller,
                          clock=time.monotonic)  # the clock of /proc's start times and the kernel log's stamps
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    kernel_log = KernelLog(str(kmsg))
    config = IncidentConfig(xid_hold=2.0, clock_margin=0.0)
    watch = IncidentWatch("gpu-node-1", labeller, names, tracker=IncidentTracker("gpu-node-1", config),
                          kernel_log=kernel_log)
    try:
        watch.observe(collector.collect_once())
        pid, a_start = a.pid, _start(a.pid)
        a.kill()
        a.wait()
        b = spawn_with_pid(pid)
        if b is None:
            pytest.skip("could not get the same PID again (ns_last_pid not writable or PID taken)")
        cgroups.adopt(b, burstable_scope(uid_b, container_id()))
        b_start = _start(pid)
        if b_start <= a_start:
            pytest.skip("both processes started in the same clock tick: their order cannot be told")
        # Xid 31 logged while A held the PID, read once B runs on the GPU under it
        watch.observe(collector.collect_once())
        with kmsg.open("a") as f:
            f.write(_line(pid, (a_start + b_start) / 2, 1))
        watch.observe(collector.collect_once())
        [incident] = watch.recent_json()
        assert incident["xid"] == 31
        assert [w["pod_uid"] for w in incident["caused_by"]] == [uid_a]
        assert incident["cause_basis"] == "kernel_log"
        assert uid_a not in [w["pod_uid"] for w in incident["affected"]]
        assert sorted(w["pod_uid"] for w in incident["affected"]) == sorted([uid_b, uid_c])
        # a line stamped after B started is B's
        with kmsg.open("a") as f:
            f.write(_line(pid, time.monotonic(), 2))
        watch.observe(collector.collect_once())
        newest = watch.recent_json()[0]
        assert [w["pod_uid"] for w in newest["caused_by"]] == [uid_b]
        # a line stamped before A started names no one (and C shares the GPU: no sole holder)
        with kmsg.open("a") as f:
            f.write(_line(pid, a_start - 5.0, 3))
        watch.observe(collector.collect_once())
        oldest = watch.recent_json()[0]
        assert oldest["caused_by"] == [] and oldest["cause_known"] is False
    finally:
        watch.close()
        attributor.close()
        backend.close()
