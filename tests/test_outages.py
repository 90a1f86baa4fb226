"""How soon `l9gpu_collector_success` shows that a node-local source is gone, or hangs.

Each source runs against its real local server: the Kubernetes API server of
tests/fakes/kubernetes_apiserver.py, and grpcio servers on unix sockets for the container
runtime (CRI) and the kubelet's pod-resources API. The collector runs its own thread, as
in the agent, and the metric is read from the rendered exposition. Each outage is either
**gone** (the server stops: connections refused or cut, the socket removed) or **silent**
(the server keeps the connection and answers nothing: a hung process, a partition); for
the API server also **held** (open watches end on time, the next request gets no answer).

The waits derive from the bound the product documents (``outage_bound`` of each source,
plus one collection interval; docs/ATTRIBUTION.md, "How soon an outage shows"), made
generous by `waiting.within` for a loaded machine, never a few seconds of wall clock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
pytest.importorskip("grpc", reason="grpcio is not installed (pip install '.[k8s]' in l9gpu's checkout)")

from fakes.cri_runtime import FakeRuntime, container  # noqa: E402
from fakes.kubelet_podresources import FakeKubelet  # noqa: E402
from fakes.kubelet_podresources import pod as pod_resources  # noqa: E402
from fakes.kubernetes_apiserver import FakeApiServer, make_pod  # noqa: E402
from kubernetes import client  # noqa: E402
from test_podresources import GPU0, StaticBackend, scrape  # noqa: E402
from waiting import wait_until, within  # noqa: E402

from exporter.attribution import cri, podresources  # noqa: E402
from exporter.attribution.kubernetes import PodIndex, PodWatcher  # noqa: E402
from exporter.attribution.resolver import ProcAttributor  # noqa: E402
from exporter.collect.collector import Collector  # noqa: E402
from exporter.core.model import DeviceSample  # noqa: E402

UID = "8c1f2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b"
CID = "3f2a" + "0" * 58 + "19"
INTERVAL = 0.2  # collection interval of these tests' collector


def success(collector: Collector, name: str) -> float | None:
    """``l9gpu_collector_success{collector=name}`` as a scrape shows it (None: absent)."""
    values = [v for labels, v in scrape(collector).get("l9gpu_collector_success", [])
              if labels.get("collector") == name]
    return values[0] if values else None


@pytest.fixture
def collector_for(tmp_path: Path) -> Iterator[Callable[..., Collector]]:
    """A running collector whose attributor has the given sources; stopped afterwards."""
    started: list[Collector] = []

    def make(**sources: Any) -> Collector:
        attributor = ProcAttributor(str(tmp_path), sources.pop("index", PodIndex()), **sources)
        collector = Collector([StaticBackend([DeviceSample(index=0, uuid=GPU0)])], "node-a", interval=INTERVAL,
                              attributor=attributor)
        collector.start()
        started.append(collector)
        return collector

    yield make
    for collector in started:
        collector.stop()
        collector.attributor.close()


def _watcher(server: FakeApiServer, index: PodIndex) -> PodWatcher:
    cfg = client.Configuration()
    cfg.host = server.url
    # Short watches, so that several complete (and must not count as stuck) while the
    # test waits; the bound is then a few seconds.
    return PodWatcher(client.ApiClient(cfg), "node-a", index, watch_seconds=1, stall_seconds=3,
                      backoff=(0.05, 0.5))


@pytest.mark.parametrize("outage", ["gone", "silent", "held"])
def test_the_api_server_outage_shows_within_the_bound(apiserver: FakeApiServer, collector_for, outage: str) -> None:
    apiserver.add(make_pod("vllm-0", "ml", UID, "node-a", {"engine": CID}))
    index = PodIndex()
    watcher = _watcher(apiserver, index)
    watcher.start()
    collector = collector_for(index=index, pod_source=watcher)
    bound = within(watcher.outage_bound + INTERVAL)
    wait_until(lambda: success(collector, "kubernetes") == 1.0, bound, "kubernetes healthy")
    # A quiet, healthy server: watches end on time and resume, none is taken for stuck.
    watches = apiserver.count("watch")
    wait_until(lambda: apiserver.count("watch") >= watches + 3, bound, "three more watches")
    assert watcher.errors == 0 and success(collector, "kubernetes") == 1.0

    if outage == "gone":
        apiserver.stop()
    else:  # silent: nothing more on any connection; held: watches end, the next gets no answer
        apiserver.stall(streams=outage == "silent")
    wait_until(lambda: success(collector, "kubernetes") == 0.0, bound, f"kubernetes unhealthy ({outage})")
    assert index.get(UID).name == "vllm-0"  # what was known stays known
    if outage != "gone":
        # The watcher's new requests are accepted and never answered: still unhealthy.
        held = apiserver.held
        wait_until(lambda: apiserver.held > held, bound, "a new request held by the stalled server")
        assert not watcher.healthy() and success(collector, "kubernetes") == 0.0

    apiserver.add(make_pod("trainer-0", "ml", "uid-new", "node-a", {"main": "d" * 64}))
    if outage == "gone":
        apiserver.start()
    else:
        apiserver.resume()
    wait_until(lambda: success(collector, "kubernetes") == 1.0 and index.get("uid-new") is not None,
               within(watcher.outage_bound + watcher.backoff[1] + INTERVAL), "kubernetes healthy again")


class _Restartable:
    """Stops and restarts a unix-socket gRPC server at the same path."""

    def __init__(self, make: Callable[[], Any]):
        self.make = make
        self.server = make()

    def gone(self) -> None:
        self.server.stop()
        if os.path.exists(self.server.path):
            os.unlink(self.server.path)

    def back(self) -> None:
        self.server = self.make()

    def close(self) -> None:
        self.server.stop()


def _cri(sockdir: str) -> _Restartable:
    def make() -> FakeRuntime:
        runtime = FakeRuntime(sockdir)
        runtime.containers = [container(CID, UID, "vllm-0", "ml", "engine")]
        return runtime
    return _Restartable(make)


def _kubelet(sockdir: str) -> _Restartable:
    def make() -> FakeKubelet:
        kubelet = FakeKubelet(sockdir)
        kubelet.pods = [pod_resources("ml", "vllm-0", engine=[("nvidia.com/gpu", [GPU0])])]
        return kubelet
    return _Restartable(make)


@pytest.mark.parametrize("outage", ["gone", "silent"])
@pytest.mark.parametrize("name", ["cri", "pod_resources"])
def test_a_socket_outage_shows_within_the_bound(sockdir: str, collector_for, name: str, outage: str) -> None:
    server = _cri(sockdir) if name == "cri" else _kubelet(sockdir)
    try:
        index = PodIndex()
        if name == "cri":
            source: Any = cri.CriPodSource(server.server.path, index, interval=0.3, timeout=2.0)
            collector = collector_for(index=index, fallback=source)
        else:
            source = podresources.PodResourcesSource(server.server.path, interval=0.3, timeout=2.0)
            collector = collector_for(index=index, allocation_source=source)
        source.start()
        bound = within(source.outage_bound + INTERVAL)
        wait_until(lambda: success(collector, name) == 1.0, bound, f"{name} healthy")
        listings = source.listings
        wait_until(lambda: source.listings >= listings + 3, bound, "three more listings")
        assert success(collector, name) == 1.0

        if outage == "gone":
            server.gone()
        else:
            server.server.hang.set()
        wait_until(lambda: success(collector, name) == 0.0, bound, f"{name} unhealthy ({outage})")
        assert source.last_code in ({"UNAVAILABLE"} if outage == "gone" else {"DEADLINE_EXCEEDED"}), (
            source.last_code, source.last_error)

        if outage == "gone":
            server.back()
        else:
            server.server.hang.clear()
            server.server.release.set()
        # gRPC reconnects to a socket that came back with a backoff of at most 5 s.
        wait_until(lambda: success(collector, name) == 1.0, within(source.outage_bound + 5.0 + INTERVAL),
                   f"{name} healthy again")
    finally:
        server.close()


def test_the_documented_bounds_are_those_of_the_defaults(sockdir: str) -> None:
    """docs/ATTRIBUTION.md promises 90 s, 31 s and 12 s: the defaults must keep that promise."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "ATTRIBUTION.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in doc.splitlines() if line.startswith("| ")}
    watcher = PodWatcher(client.ApiClient(client.Configuration()), "node-a", PodIndex())
    runtime = cri.CriPodSource(os.path.join(sockdir, "cri.sock"), PodIndex())
    kubelet = podresources.PodResourcesSource(os.path.join(sockdir, "kubelet.sock"))
    try:
        for row, source in (("API server (`kubernetes`)", watcher), ("CRI socket (`cri`)", runtime),
                            ("kubelet pod-resources (`pod_resources`)", kubelet)):
            assert f"**{source.outage_bound:g} s**" in rows[row], (row, source.outage_bound)
    finally:
        runtime.stop()
        kubelet.stop()
