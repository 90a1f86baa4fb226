"""What only some backends can do is declared by them and asked of them alone.

`exporter.devices.base.Backend` holds what every backend does; timing the library's calls,
GPM status and per-process shares read once the owners are known are interfaces of
`exporter.devices.capabilities` that a backend subclasses. The collector, the wiring and
`l9gpu snapshot` ask for them with ``isinstance``: a backend without one is simply not
asked, and the demo's scenario and kernel log reach attribution and the incidents through
the wiring, not through the vendor contract.
"""

from __future__ import annotations

import json

import pytest

from exporter.app.cli import build_parser
from exporter.app.cli import main as cli_main
from exporter.app.wiring import build_incident_watch, gpm_status, simulated_node, simulated_scenario
from exporter.collect.collector import Collector
from exporter.core.bulkhead import Read
from exporter.core.model import DeviceSample, ProcessSample
from exporter.core.shares import READ_ALL, PassPlan
from exporter.devices import registry
from exporter.devices.base import Backend
from exporter.devices.capabilities import GpmStatus, ProcessShareReads, Timings
from exporter.devices.simulated import SimulatedBackend
from exporter.incidents.simulated import ScenarioKernelLog

CAPABILITIES = (Timings, GpmStatus, ProcessShareReads)


class Plain(Backend):
    """A backend with the contract only: one GPU, two processes, their shares read in its pass."""

    name = "plain"

    def __init__(self) -> None:
        self.plans: list[PassPlan] = []

    def reads(self, now: float, plan: PassPlan = READ_ALL) -> list[Read]:
        self.plans.append(plan)
        return super().reads(now, plan)

    def sample(self, now: float) -> list[DeviceSample]:
        return [DeviceSample(index=0, uuid="GPU-0", model="m", vendor="v", utilization=0.5, processes=(
            ProcessSample(pid=101, used_memory_bytes=1, sm_utilization=0.2),
            ProcessSample(pid=102, used_memory_bytes=1, sm_utilization=0.3)))]


class WithGpm(Plain):
    name = "gpm"

    def gpm_status(self) -> dict[tuple[int, str], str]:
        return {(0, ""): "active"}


class DeclaredGpm(WithGpm, GpmStatus):
    name = "declared"


class Deferring(Plain, ProcessShareReads):
    name = "deferring"

    def process_share_reads(self, devices):  # type: ignore[no-untyped-def]
        return []


def test_the_contract_holds_only_what_every_backend_does():
    for only_some in ("gpm_status", "enable_timings", "timings", "process_share_reads", "defers_process_shares",
                      "kernel_log", "simulated_scenario"):
        assert only_some not in vars(Backend), only_some


def test_each_backend_declares_what_it_can_do():
    declared = {name: {c.__name__ for c in CAPABILITIES if issubclass(backend, c)}
                for name, backend in registry().items()}
    assert declared == {"nvml": {"Timings", "GpmStatus", "ProcessShareReads"}, "amd": set(), "gaudi": set(),
                        "simulated": set()}


def test_a_backend_that_declares_a_capability_and_lacks_its_method_cannot_be_built():
    class Forgetful(Plain, Timings):
        name = "forgetful"

        def enable_timings(self) -> bool:
            return True

    with pytest.raises(TypeError, match="timings"):
        Forgetful()  # type: ignore[abstract]


def test_gpm_status_is_asked_only_of_the_backends_that_declare_it():
    # a method of the same name on a backend that does not declare the capability is not discovered
    assert gpm_status([Plain(), WithGpm()]) == {}
    assert gpm_status([Plain(), DeclaredGpm()]) == {(0, ""): "active"}


def test_a_backend_without_process_share_reads_reads_every_gpus_shares_in_its_pass():
    plain, deferring = Plain(), Deferring()
    snap = Collector([plain], "n").collect_once()
    assert plain.plans[0].process_metrics  # every GPU's per-process samples, in its pass
    assert [p.sm_utilization for d in snap.devices for p in d.processes] == [0.2, 0.3]  # as it read them
    Collector([deferring], "n").collect_once()
    assert not deferring.plans[0].process_metrics  # left until the owners are known


def test_snapshot_timings_on_a_backend_without_them_says_so(capsys):
    argv = ["snapshot", "--backend", "simulated", "--interval", "50ms", "--incidents-from", "off", "--timings"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("no per-call timings for the simulated backend (NVIDIA's nvml backend has them)")
    assert cli_main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["timings"] == {"first pass": {}, "steady pass": {}}


def test_the_wiring_hands_the_simulated_nodes_scenario_and_kernel_log_on():
    node = SimulatedBackend("incidents")
    node.open()
    assert simulated_node([Plain(), node]) is node
    assert simulated_scenario([Plain(), node]) is node.scenario
    assert simulated_scenario([Plain()]) is None
    args = build_parser().parse_args(["serve", "--backend", "simulated", "--kubernetes", "off",
                                      "--kernel-log", "auto"])
    args.node_name = "n"
    watch = build_incident_watch(args, None, [Plain(), node])
    try:
        assert isinstance(watch.kernel_log, ScenarioKernelLog)  # --kernel-log auto: the node's own
    finally:
        watch.close()
    args.kernel_log = "off"
    assert build_incident_watch(args, None, [node]).kernel_log is None


def test_the_simulated_kernel_log_reads_each_xid_once_its_time_has_come():
    now = [500.0]
    node = SimulatedBackend("incidents", clock=lambda: now[0])
    node.open()
    assert node.scenario is not None and node.scenario.xids
    first = node.scenario.xids[0]
    log = ScenarioKernelLog(node)
    now[0] = 500.0 + first.at - 0.5
    assert log.poll() == []
    now[0] = 500.0 + first.at
    (record,) = log.poll()
    assert (record.xid, record.pid, record.pci_bus_id) == (first.xid, first.pid, "00000000:28:00.0")
    assert record.boot_usec == int((500.0 + first.at) * 1e6)  # stamped on the node's clock
    assert log.poll() == [] and log.counts() == {"read": 1, "xid": 1}
