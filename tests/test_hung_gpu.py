"""A driver call that never returns degrades only its own GPU, and the agent says so.

The NVML fake's calls can be made to hang until released (`fakes.pynvml_fake.Block`: a
``threading.Event`` wait, which, like a thread stuck in a ctypes call, nothing can
interrupt). The real collector runs its own thread on it, as in the agent, and what a
user sees is read where they read it: the rendered exposition, the snapshot document
and the page, the HTTP probes on a real loopback server, ``l9gpu snapshot``'s output,
the log. Waits derive from what the product promises (the other GPUs fresh again
within three intervals, at least 3 s, of a call that does not return), made generous by
`waiting.within` for a loaded machine.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Iterator

import pytest
from agent import parse_metrics, pick
from aiohttp.test_utils import TestClient, TestServer
from fakes.pynvml_fake import Block, FakeGpu, FakeHandle, FakeNvml, install
from prometheus_client import CollectorRegistry, generate_latest
from waiting import wait_until, within

from exporter.collect.collector import Collector
from exporter.core.bulkhead import DEFAULT_READ_TIMEOUT, Bulkhead, Failed, Read, Stuck
from exporter.core.model import DeviceSample
from exporter.devices.base import Backend
from exporter.devices.nvml import NvmlBackend
from exporter.output import catalogue as cat
from exporter.output.render import SnapshotCollector
from exporter.output.snapshot_json import snapshot_document
from exporter.web.app import make_app
from exporter.web.exposition import Exposition
from exporter.web.page import render_page

INTERVAL = 0.5  # the collector's interval in these tests
# What the product promises: within three intervals (at least 3 s) of a call that does
# not return, the other GPUs are fresh again at the interval.
PROMISE = max(3 * INTERVAL, 3.0)
STUCK = "nvmlDeviceGetPowerUsage"


def scrape(collector: Collector) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, cat.enabled_names()))
    return parse_metrics(generate_latest(registry).decode())


def value(source: Collector, name: str, /, **labels: str) -> float | None:
    values = pick(scrape(source), name, **labels)
    return values[0] if len(values) == 1 else None


_BEFORE: list[threading.Thread] = []  # the threads alive when the node fixture started

@pytest.fixture
def node() -> Iterator[tuple[FakeNvml, Collector]]:
    """Four fake GPUs (utilisation 10%) read by a running collector; every block released after."""
    before = set(threading.enumerate())
    _BEFORE[:] = list(before)
    fake = FakeNvml([FakeGpu(utilization_gpu=10) for _ in range(4)])
    backend = NvmlBackend(nvml=fake)
    backend.open()
    collector = Collector([backend], "gpu-node", interval=INTERVAL)
    collector.start()
    wait_until(lambda: value(collector, "gpu_utilization_ratio", gpu="0") == pytest.approx(0.1), within(INTERVAL),
               "the first pass")
    yield fake, collector
    for block in fake.blocks:
        block.release()
    collector.stop()
    backend.close()
    wait_until(lambda: not [t for t in threading.enumerate() if t not in before and t.name.startswith("l9gpu")],
               within(INTERVAL), "the collector's threads to end")


def read_threads() -> list[str]:
    """The read threads this test's collector started (collectors of earlier tests in the
    same process may leave their idle workers behind)."""
    before = set(_BEFORE)
    return [t.name for t in threading.enumerate() if t not in before and t.name.startswith("l9gpu-read")]


def stuck_gpu(fake: FakeNvml, collector: Collector, gpu: int = 1) -> Block:
    """Make GPU ``gpu``'s power reading hang and wait until the collector reports it stuck."""
    block = fake.block(STUCK, gpu=gpu)
    wait_until(block.entered.is_set, within(INTERVAL), "a pass to call into the blocked GPU")
    wait_until(lambda: value(collector, "gpu_up", gpu=str(gpu)) == 0.0, within(PROMISE), f"GPU {gpu} reported down")
    return block


# ---- one GPU of four hangs ------------------------------------------------------------------


def test_the_other_gpus_stay_fresh_while_one_call_hangs(node) -> None:
    fake, collector = node
    block = fake.block(STUCK, gpu=1)
    wait_until(block.entered.is_set, within(INTERVAL), "a pass to call into the blocked GPU")
    blocked_at = time.monotonic()
    fake.gpus[0].utilization_gpu = 90  # GPU 0 changes while GPU 1's call hangs
    wait_until(lambda: value(collector, "gpu_utilization_ratio", gpu="0") == pytest.approx(0.9), within(PROMISE),
               "GPU 0's new utilisation on /metrics")
    shown_after = time.monotonic() - blocked_at
    # ... and keeps up at the interval: each change shows, in new passes, while GPU 1 hangs.
    for percent in (30, 70):
        fake.gpus[0].utilization_gpu = percent
        wait_until(lambda p=percent: value(collector, "gpu_utilization_ratio", gpu="0") == pytest.approx(p / 100),
                   within(INTERVAL), f"GPU 0 at {percent}%")
    assert block.waiting == 1  # still stuck all along
    assert [value(collector, "gpu_up", gpu=g) for g in "023"] == [1.0, 1.0, 1.0]
    print(f"GPU 0's change shown {shown_after:.2f} s after GPU 1's call hung (promise: {PROMISE:g} s)")


def test_the_stuck_gpu_is_down_with_the_call_and_since_when(node, caplog) -> None:
    fake, collector = node
    with caplog.at_level(logging.WARNING, logger="exporter"):
        before = time.time()
        stuck_gpu(fake, collector)
        seq = collector.snapshot.seq
        wait_until(lambda: collector.snapshot.seq >= seq + 3, within(3 * INTERVAL), "three more passes")

    m = scrape(collector)
    assert pick(m, "gpu_up", gpu="1") == [0.0]
    (seconds,) = pick(m, "gpu_stuck_call_seconds", gpu="1", call=STUCK, uuid=fake.gpus[1].uuid,
                      model=fake.gpus[1].name, node="gpu-node")
    assert DEFAULT_READ_TIMEOUT <= seconds < time.time() - before + 1
    assert pick(m, "gpu_stuck_call_seconds", gpu="0") == []  # only the stuck one
    assert pick(m, "gpu_power_watts", gpu="1") == []  # no stale values for it
    assert pick(m, "gpu_info", gpu="1", uuid=fake.gpus[1].uuid) == [1.0]  # still known
    assert pick(m, "l9gpu_collector_success", collector="nvml") == [0.0]

    snap = collector.snapshot
    doc = snapshot_document(snap)
    gpu1 = doc["gpus"][1]
    assert gpu1["up"] is False and f"stuck in {STUCK}" in gpu1["error"] and "since" in gpu1["error"]
    assert gpu1["stuck"]["call"] == STUCK and before - 1 <= gpu1["stuck"]["since"] <= time.time()
    assert [g["up"] for g in doc["gpus"]] == [True, False, True, True]
    assert doc["stuck"] == [{**gpu1["stuck"], "gpus": [1]}]
    page = render_page(doc, "gpu-node", INTERVAL)
    assert f"is down: stuck in {STUCK} for" in page and "GPU 1" in page

    # Logged once when given up on, not once per pass.
    warnings = [r.getMessage() for r in caplog.records if STUCK in r.getMessage()]
    assert len(warnings) == 1 and "GPU 1" in warnings[0], warnings


def test_nothing_else_is_asked_of_the_stuck_gpu(node) -> None:
    fake, collector = node
    stuck_gpu(fake, collector)
    start = len(fake.calls)
    seq = collector.snapshot.seq
    wait_until(lambda: collector.snapshot.seq >= seq + 3, within(3 * INTERVAL), "three more passes")
    later = fake.calls[start:]
    about = {args[0].index for _, args in later if args and isinstance(args[0], FakeHandle)}
    assert about == {0, 2, 3}, about  # the others are read every pass, GPU 1 never
    assert [name for name, _ in later if name == "nvmlGpmSampleFree"] == []  # its GPM buffers are kept
    threads = read_threads()
    assert len(threads) <= 3, threads  # the stuck one, the worker, at most one fanned-out read finishing


def test_the_gpu_comes_back_when_the_call_returns(node, caplog) -> None:
    fake, collector = node
    block = stuck_gpu(fake, collector)
    fake.gpus[1].power_mw = 321_000
    with caplog.at_level(logging.WARNING, logger="exporter"):
        block.release()
        wait_until(lambda: value(collector, "gpu_up", gpu="1") == 1.0, within(2 * INTERVAL), "GPU 1 back up")
    m = scrape(collector)
    assert pick(m, "gpu_power_watts", gpu="1") == [321.0]
    assert pick(m, "gpu_stuck_call_seconds") == []
    wait_until(lambda: value(collector, "l9gpu_collector_success", collector="nvml") == 1.0, within(INTERVAL),
               "the nvml collector healthy again")
    assert any("returned after" in r.getMessage() and "reading it again" in r.getMessage() and "GPU 1" in r.getMessage()
               for r in caplog.records)
    assert collector.snapshot.stuck == ()


def test_a_call_that_hangs_for_a_while_and_returns_by_itself_gives_the_gpu_back(node) -> None:
    fake, collector = node
    block = fake.block(STUCK, gpu=2, seconds=3 * DEFAULT_READ_TIMEOUT)  # as the issue saw: 30 s, shorter here
    wait_until(lambda: value(collector, "gpu_up", gpu="2") == 0.0, within(PROMISE), "GPU 2 reported down")
    wait_until(lambda: value(collector, "gpu_up", gpu="2") == 1.0, within(3 * DEFAULT_READ_TIMEOUT + PROMISE),
               "GPU 2 back once its call returned")
    assert block.calls == 1  # no second call was made while the first hung
    block.release()


def test_a_gpu_that_keeps_overrunning_is_logged_once_a_minute_not_every_pass(node, caplog) -> None:
    fake, collector = node
    with caplog.at_level(logging.WARNING, logger="exporter"):
        for _ in range(3):  # each time one call takes twice the read timeout, then it answers
            block = fake.block(STUCK, gpu=3, seconds=2 * DEFAULT_READ_TIMEOUT)
            wait_until(lambda: value(collector, "gpu_up", gpu="3") == 0.0, within(PROMISE), "GPU 3 down")
            wait_until(lambda: value(collector, "gpu_up", gpu="3") == 1.0, within(PROMISE), "GPU 3 back")
            assert block.calls == 1
    messages = [r.getMessage() for r in caplog.records if "GPU 3" in r.getMessage()]
    assert len([m for m in messages if "has not returned" in m]) == 1, messages
    assert len([m for m in messages if "reading it again" in m]) == 1, messages


def test_a_hung_xid_event_wait_leaves_the_gpus_up_and_says_so(node) -> None:
    fake, collector = node
    block = fake.block("nvmlEventSetWait")
    wait_until(block.entered.is_set, within(INTERVAL), "a pass to wait for XID events")
    wait_until(lambda: collector.snapshot.stuck, within(PROMISE), "the event wait reported stuck")
    (call,) = collector.snapshot.stuck
    assert (call.what, call.call, call.devices) == ("NVML XID events", "nvmlEventSetWait", ())
    fake.gpus[2].utilization_gpu = 60
    wait_until(lambda: value(collector, "gpu_utilization_ratio", gpu="2") == pytest.approx(0.6), within(PROMISE),
               "GPU 2 read while the event wait hangs")
    m = scrape(collector)
    assert pick(m, "gpu_up") == [1.0] * 4 and pick(m, "l9gpu_collector_success", collector="nvml") == [0.0]
    page = render_page(snapshot_document(collector.snapshot), "gpu-node", INTERVAL)
    assert "NVML XID events</b>: stuck in nvmlEventSetWait" in page


# ---- every call hangs (the driver's own lock held) -------------------------------------------


def _probe(app: Any, *paths: str) -> dict[str, tuple[int, str]]:
    async def run() -> dict[str, tuple[int, str]]:
        async with TestClient(TestServer(app)) as client:
            out = {}
            for path in paths:
                response = await client.get(path)
                out[path] = (response.status, await response.text())
            return out

    return asyncio.run(run())


def _app(collector: Collector) -> Any:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, cat.enabled_names()))
    exposition = Exposition(registry, lambda: collector.snapshot, max_age=0.0)
    return make_app(exposition, lambda: collector.snapshot, collector.alive, "gpu-node", health=collector.liveness)


def test_when_every_call_hangs_the_agent_says_so_and_stays_scraped(node) -> None:
    fake, collector = node
    block = fake.block()  # the driver's lock is held: every call hangs
    started = time.monotonic()
    wait_until(lambda: all(d.error.startswith("stuck in ") for d in collector.snapshot.devices), within(PROMISE),
               "every GPU reported stuck")
    print(f"every GPU reported stuck {time.monotonic() - started:.2f} s after the driver hung")
    # Passes go on at the interval, with fresh timestamps and nothing old served as new.
    seq = collector.snapshot.seq
    wait_until(lambda: collector.snapshot.seq >= seq + 2, within(2 * INTERVAL), "two more passes")
    snap = collector.snapshot
    assert time.time() - snap.timestamp < within(INTERVAL)
    assert {d.index: d.up for d in snap.devices} == {0: False, 1: False, 2: False, 3: False}
    assert {s.what for s in snap.stuck} == {"NVML XID events", "GPU 0", "GPU 1", "GPU 2", "GPU 3"}
    m = scrape(collector)
    assert pick(m, "gpu_utilization_ratio") == [] and pick(m, "gpu_up") == [0.0] * 4
    assert sorted(lab["gpu"] for lab, _ in m["gpu_stuck_call_seconds"]) == ["0", "1", "2", "3"]
    # No thread piles up: at most one per stuck part, whatever the number of passes.
    assert block.waiting <= 5 and len(read_threads()) <= 6

    # Live (a restart cannot unstick the driver) and ready (so Prometheus keeps scraping
    # and alerts on the down GPUs); both say what is wrong.
    probes = _probe(_app(collector), "/healthz", "/readyz", "/metrics")
    assert probes["/healthz"][0] == 200 and "stuck in driver calls: " in probes["/healthz"][1]
    assert "GPU 3: " in probes["/healthz"][1]
    assert probes["/readyz"][0] == 200 and "stuck in driver calls" in probes["/readyz"][1]
    assert pick(parse_metrics(probes["/metrics"][1]), "gpu_up") == [0.0] * 4

    block.release()
    wait_until(lambda: [d.up for d in collector.snapshot.devices] == [True] * 4, within(2 * INTERVAL),
               "every GPU back")
    probes = _probe(_app(collector), "/healthz", "/readyz")
    assert probes == {"/healthz": (200, "ok\n"), "/readyz": (200, "ok\n")}


def test_healthz_fails_when_the_collector_itself_stops_finishing_passes(monkeypatch) -> None:
    release = threading.Event()

    class HangingAttribution:
        """Attribution that hangs outside any device read (a bug, a hung filesystem)."""

        def __init__(self) -> None:
            self.calls = 0

        def resolve(self, pids, now):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls > 1:
                release.wait()
            return {}

        def comm(self, pid: int) -> str:
            return ""

        def start_time(self, pid: int) -> float | None:
            return None

        generation = 0

        def statuses(self) -> dict[str, bool]:
            return {}

        def info(self) -> dict[str, float]:
            return {}

        def close(self) -> None:
            pass

    monkeypatch.setattr(Collector, "stall_limit", property(lambda self: 4 * INTERVAL))
    collector = Collector([_Static([DeviceSample(index=0, uuid="GPU-a")])], "n", interval=INTERVAL,
                          attributor=HangingAttribution())  # type: ignore[arg-type]
    collector.start()
    try:
        wait_until(lambda: collector.snapshot is not None, within(INTERVAL), "the first pass")
        wait_until(lambda: not collector.liveness()[0], within(4 * INTERVAL), "liveness failing")
        status, text = _probe(_app(collector), "/healthz")["/healthz"]
        assert status == 503 and "no collection pass has finished for" in text
        assert _probe(_app(collector), "/readyz")["/readyz"][0] == 200  # still scraped: the age says it
    finally:
        release.set()
        collector.stop()


# ---- other backends: the collector's bulkhead applies to every one -----------------------------


class _Static(Backend):
    """A backend with fixed devices whose whole read can be made to hang."""

    name = "static"
    call_prefixes = ("hang_",)

    def __init__(self, devices: list[DeviceSample]):
        self.devices = devices
        self.hang: threading.Event | None = None
        self.entered = threading.Event()

    def open(self) -> None:
        pass

    def hang_in_the_library(self) -> None:
        self.entered.set()
        assert self.hang is not None
        self.hang.wait()

    def sample(self, now: float) -> list[DeviceSample]:
        if self.hang is not None and not self.hang.is_set():
            self.hang_in_the_library()
        return list(self.devices)

    def close(self) -> None:
        pass


def test_a_hung_backend_without_parts_is_down_as_a_whole_and_the_other_backend_carries_on() -> None:
    fake = FakeNvml([FakeGpu(utilization_gpu=10)])
    nvml = NvmlBackend(nvml=fake)
    nvml.open()
    other = _Static([DeviceSample(index=0, uuid="GPU-amd-0", model="MI300X", vendor="amd", utilization=0.5),
                     DeviceSample(index=1, uuid="GPU-amd-1", model="MI300X", vendor="amd", utilization=0.5)])
    collector = Collector([nvml, other], "mixed", interval=INTERVAL)
    collector.start()
    try:
        wait_until(lambda: value(collector, "gpu_up", uuid="GPU-amd-1") == 1.0, within(INTERVAL), "the first pass")
        other.hang = threading.Event()
        wait_until(other.entered.is_set, within(INTERVAL), "a pass into the hanging backend")
        wait_until(lambda: value(collector, "gpu_up", uuid="GPU-amd-0") == 0.0, within(PROMISE),
                   "the hung backend's GPUs down")
        fake.gpus[0].utilization_gpu = 80
        wait_until(lambda: value(collector, "gpu_utilization_ratio", uuid=fake.gpus[0].uuid) == pytest.approx(0.8),
                   within(PROMISE), "the NVIDIA GPU still read")
        m = scrape(collector)
        assert sorted(lab["uuid"] for lab, _ in m["gpu_stuck_call_seconds"]) == ["GPU-amd-0", "GPU-amd-1"]
        assert {lab["call"] for lab, _ in m["gpu_stuck_call_seconds"]} == {"hang_in_the_library"}
        other.hang.set()
        wait_until(lambda: value(collector, "gpu_up", uuid="GPU-amd-1") == 1.0, within(2 * INTERVAL),
                   "the backend back")
    finally:
        if other.hang is not None:
            other.hang.set()
        collector.stop()
        nvml.close()


def test_an_amd_gpu_stuck_in_amdsmi_degrades_only_itself() -> None:
    from fakes.amdsmi_fake import FakeAmdSmi
    from fakes.amdsmi_fake import FakeGpu as AmdGpu

    from exporter.devices.amd.backend import AmdBackend

    gpus = [AmdGpu(uuid=f"a4ff740f-0000-1000-80ea-3fe8d9b2e51{i}", bdf=f"0000:c{i}:00.0") for i in range(3)]
    backend = AmdBackend(amdsmi=FakeAmdSmi(gpus))
    backend.open()
    collector = Collector([backend], "amd-node", interval=INTERVAL)
    collector.start()
    hang = threading.Event()
    try:
        wait_until(lambda: value(collector, "gpu_up", gpu="2") == 1.0, within(INTERVAL), "the first pass")
        gpus[1].hang = hang
        wait_until(lambda: value(collector, "gpu_up", gpu="1") == 0.0, within(PROMISE), "GPU 1 down")
        gpus[0].gfx_activity = 77
        wait_until(lambda: value(collector, "gpu_utilization_ratio", gpu="0") == pytest.approx(0.77), within(PROMISE),
                   "GPU 0 read while GPU 1 hangs")
        (call,) = collector.snapshot.stuck
        assert (call.backend, call.what, call.call) == ("amd", "GPU 1", "amdsmi_get_gpu_activity")
        assert value(collector, "gpu_stuck_call_seconds", gpu="1", call="amdsmi_get_gpu_activity") >= 1.0
        gpus[1].hang = None
        hang.set()
        wait_until(lambda: value(collector, "gpu_up", gpu="1") == 1.0, within(2 * INTERVAL), "GPU 1 back")
    finally:
        hang.set()
        collector.stop()
        backend.close()


# ---- the bulkhead itself -------------------------------------------------------------------------


def _read(key: Any, run: Any, **kwargs: Any) -> Read:
    return Read(key, f"part {key}", run, calls=("hang_",), **kwargs)


def test_a_pass_where_every_read_hangs_ends_within_two_timeouts_whatever_their_number() -> None:
    gate = threading.Event()

    def hang_here() -> list[int]:
        gate.wait()
        return [1]

    bulkhead = Bulkhead(timeout=0.3)
    try:
        started = time.monotonic()
        out = bulkhead.run([_read(i, hang_here) for i in range(8)])
        took = time.monotonic() - started
        assert all(isinstance(o, Stuck) and o.call == "hang_here" for o in out)
        # Two timeouts and scheduling: the first read's, then all the others' together.
        assert took < within(2 * 0.3), took
        # While stuck, a pass asks nothing of them and returns at once.
        started = time.monotonic()
        assert all(isinstance(o, Stuck) for o in bulkhead.run([_read(i, hang_here) for i in range(8)]))
        assert time.monotonic() - started < 0.3
    finally:
        gate.set()
    wait_until(lambda: not bulkhead.stuck(), within(0.3), "every stuck read returned")
    assert bulkhead.run([_read(i, lambda i=i: [i]) for i in range(8)]) == [[i] for i in range(8)]


def test_reads_keep_their_order_and_the_last_runs_after_the_others() -> None:
    gate = threading.Event()
    order: list[str] = []
    lock = threading.Lock()

    def note(name: str, hang: bool = False) -> Any:
        def run() -> list[str]:
            if hang:
                gate.wait()
            with lock:
                order.append(name)
            return [name]
        return run

    bulkhead = Bulkhead(timeout=0.3)
    try:
        out = bulkhead.run([_read("a", note("a")), _read("b", note("b", hang=True)), _read("c", note("c")),
                            _read("d", lambda: 1 / 0), _read("z", note("z"), last=True)])
    finally:
        gate.set()
    assert out[0] == ["a"] and isinstance(out[1], Stuck) and out[2] == ["c"] and out[4] == ["z"]
    assert isinstance(out[3], Failed) and isinstance(out[3].error, ZeroDivisionError)
    assert order[-1] == "z" and order[0] == "a"  # the last one after the fanned-out ones
    wait_until(lambda: "b" in order, within(0.3), "the stuck read to finish once released")
    assert bulkhead.stuck() == []


def test_a_read_given_up_on_stops_when_its_call_returns() -> None:
    from exporter.core.bulkhead import check_abandoned

    gate, after = threading.Event(), threading.Event()

    def run() -> list[int]:
        gate.wait()  # the call that hangs
        check_abandoned()  # what a backend does after each call
        after.set()  # not reached: the stale read goes no further
        return [1]

    bulkhead = Bulkhead(timeout=0.2)
    (out,) = bulkhead.run([_read("gpu", run)])
    assert isinstance(out, Stuck) and bulkhead.stuck()[0].key == "gpu"
    gate.set()
    wait_until(lambda: not bulkhead.stuck(), within(0.2), "the read to return")
    assert not after.is_set()


# ---- l9gpu snapshot -------------------------------------------------------------------------------


def _snapshot(monkeypatch, capsys, fake: FakeNvml, *args: str) -> tuple[int, str, str, float]:
    """``l9gpu snapshot ARGS`` in process, on the fake (its threads must meet the blocks).

    Afterwards the blocks are released and the threads left stuck in them are waited for,
    so that they do not log into another test's output.
    """
    from exporter.app.cli import main

    install(monkeypatch, fake)
    root = logging.getLogger()
    # main() sets up logging for the process: keep this test run's handlers and level.
    handlers, level = list(root.handlers), root.level
    before = set(threading.enumerate())
    started = time.monotonic()
    try:
        status = main(["snapshot", "--backend", "nvml", "--kubernetes", "off", "--pod-resources-socket", "off",
                       "--cri-socket", "off", "--gpm-interval", "off", *args])
        took = time.monotonic() - started
        out, err = capsys.readouterr()
    finally:
        for block in fake.blocks:
            block.release()
        wait_until(lambda: not [t for t in threading.enumerate() if t not in before and t.name.startswith("l9gpu")],
                   within(1.0), "the threads left stuck to return")
        root.handlers[:] = handlers
        root.setLevel(level)
    return status, out, err, took


def test_snapshot_prints_what_it_could_read_within_its_timeout(monkeypatch, capsys) -> None:
    fake = FakeNvml([FakeGpu(utilization_gpu=10 * (i + 1)) for i in range(4)])
    fake.block(STUCK, gpu=1)
    status, out, err, took = _snapshot(monkeypatch, capsys, fake, "--timeout", "1s")
    assert status == 0, err
    assert took < within(2 * 1.0), took
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line[:1].isdigit()}
    assert "DOWN: stuck in nvmlDeviceGetPowerUsage for" in lines["1"]
    assert [f" {p}% " in lines[g] for g, p in (("0", 10), ("2", 30), ("3", 40))] == [True] * 3


def test_snapshot_json_lists_the_stuck_call(monkeypatch, capsys) -> None:
    import json

    fake = FakeNvml([FakeGpu() for _ in range(2)])
    fake.block(STUCK, gpu=0)
    status, out, err, _ = _snapshot(monkeypatch, capsys, fake, "--timeout", "1s", "--json")
    doc = json.loads(out)
    assert status == 0 and [g["up"] for g in doc["gpus"]] == [False, True]
    assert doc["stuck"][0]["call"] == STUCK and doc["stuck"][0]["gpus"] == [0]
    assert doc["gpus"][0]["stuck"]["seconds"] >= 1.0


def test_snapshot_gives_up_on_a_driver_that_does_not_open(monkeypatch, capsys) -> None:
    fake = FakeNvml([FakeGpu()])
    fake.block("nvmlInit")
    status, out, err, took = _snapshot(monkeypatch, capsys, fake, "--timeout", "1s")
    assert status == 1 and out == ""
    assert err.strip() == "l9gpu: the nvml backend did not open within 1s (stuck in nvmlInit); nothing could be read"
    assert took < within(1.0)


def test_snapshot_timeout_must_be_a_duration() -> None:
    from agent import run_cli

    result = run_cli(["snapshot", "--backend", "simulated", "--timeout", "soon"])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--timeout" in result.stderr


# ---- the real agent, in its own process -------------------------------------------------------


def _agent(tmp_path, hang: list[dict[str, Any]], *extra: str) -> Any:
    """``l9gpu serve --backend nvml`` whose ``import pynvml`` is the fake (tests/fakes/nvml_shim)."""
    import json
    import os

    from agent import REPO, AgentProcess

    spec = {"gpus": [{"utilization_gpu": 10, "power_mw": 200_000} for _ in range(4)], "hang": hang}
    path = os.pathsep.join([str(REPO / "tests" / "fakes" / "nvml_shim"), str(REPO / "tests"), str(REPO)])
    return AgentProcess(["--backend", "nvml", "--interval", f"{INTERVAL}s", "--kubernetes", "off",
                         "--cri-socket", "off", "--pod-resources-socket", "off", *extra],
                        env={"PYTHONPATH": path, "FAKE_NVML_SPEC": json.dumps(spec)},
                        log_path=tmp_path / "agent.log")


def _seq(agent: Any) -> int:
    import json

    status, _, body = agent.get("/api/v1/snapshot")
    assert status == 200, body
    return int(json.loads(body)["seq"])


def test_the_agent_serves_a_hung_gpu_as_down_and_takes_it_back(tmp_path) -> None:
    hang = tmp_path / "gpu-1-hangs"
    hang.touch()
    agent = _agent(tmp_path, [{"call": STUCK, "gpu": 1, "while_exists": str(hang)}])
    agent.start()  # ready: the first pass was published, with GPU 1 given up on
    try:
        m = agent.samples()
        assert pick(m, "gpu_up", gpu="1") == [0.0] and pick(m, "gpu_up", gpu="0") == [1.0]
        assert pick(m, "gpu_stuck_call_seconds", gpu="1", call=STUCK)[0] >= DEFAULT_READ_TIMEOUT
        # Passes go on at the interval: new snapshots, GPU 0's energy counter moving.
        seq, energy = _seq(agent), pick(m, "gpu_energy_joules_total", gpu="0")[0]
        wait_until(lambda: _seq(agent) >= seq + 3, within(3 * INTERVAL), "three more passes")
        assert pick(agent.samples(), "gpu_energy_joules_total", gpu="0")[0] > energy
        status, _, body = agent.get("/healthz")
        assert status == 200 and f"GPU 1: {STUCK} for" in body.decode()
        assert agent.get("/readyz")[0] == 200
        status, _, page = agent.get("/")
        assert status == 200 and f"is down: stuck in {STUCK} for" in page.decode()
        assert agent.log().count("has not returned after") == 1, agent.log()

        hang.unlink()  # the driver answers again
        wait_until(lambda: pick(agent.samples(), "gpu_up", gpu="1") == [1.0], within(2 * INTERVAL), "GPU 1 back")
        assert pick(agent.samples(), "gpu_power_watts", gpu="1") == [200.0]
        assert "GPU 1: nvmlDeviceGetPowerUsage returned after" in agent.log()
    finally:
        if hang.exists():
            hang.unlink()
        agent.stop()


def test_read_timeout_sets_how_long_a_gpu_may_take_before_it_is_reported_stuck(tmp_path) -> None:
    """``--read-timeout 2500ms`` (a driver known to be slow): GPU 1's hanging call is
    reported only once it has waited that long, the other GPUs as usual."""
    hang = tmp_path / "gpu-1-hangs"
    hang.touch()
    agent = _agent(tmp_path, [{"call": STUCK, "gpu": 1, "while_exists": str(hang)}], "--read-timeout", "2500ms")
    agent.start()  # ready: the first pass was published, with GPU 1 given up on
    try:
        m = agent.samples()
        assert pick(m, "gpu_up", gpu="1") == [0.0] and pick(m, "gpu_up", gpu="0") == [1.0]
        assert pick(m, "gpu_stuck_call_seconds", gpu="1", call=STUCK)[0] >= 2.5
        assert f"GPU 1: {STUCK} has not returned after 2." in agent.log()
        hang.unlink()
        wait_until(lambda: pick(agent.samples(), "gpu_up", gpu="1") == [1.0], within(2 * 2.5), "GPU 1 back")
    finally:
        if hang.exists():
            hang.unlink()
        agent.stop()


def test_the_agent_says_so_when_every_call_hangs_and_still_exits_on_sigterm(tmp_path) -> None:
    held = tmp_path / "driver-lock-held"
    agent = _agent(tmp_path, [{"while_exists": str(held)}])  # every call, once the file exists
    agent.start()
    try:
        assert pick(agent.samples(), "gpu_up") == [1.0] * 4
        held.touch()
        wait_until(lambda: pick(agent.samples(), "gpu_up") == [0.0] * 4, within(PROMISE), "every GPU down")
        m = agent.samples()
        assert sorted(lab["gpu"] for lab, _ in m["gpu_stuck_call_seconds"]) == ["0", "1", "2", "3"]
        assert pick(m, "l9gpu_snapshot_age_seconds")[0] < within(INTERVAL)  # fresh passes, no old values
        assert pick(m, "gpu_utilization_ratio") == []
        status, _, body = agent.get("/healthz")
        assert status == 200 and "stuck in driver calls" in body.decode()
        assert agent.get("/readyz")[0] == 200
        # SIGTERM while the calls hang: the agent does not wait for the driver to exit.
        started = time.monotonic()
        assert agent.stop() == 0
        assert time.monotonic() - started < within(1.0), agent.log()
        assert "exiting without it" in agent.log()
    finally:
        if held.exists():
            held.unlink()
        agent.stop()
