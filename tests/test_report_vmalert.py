"""The chargeback recording rules on VictoriaMetrics: vmalert replays them over a history
stored in a real VictoriaMetrics (Debian's victoria-metrics package: victoria-metrics and
vmalert), and the recorded hours are the same figures promtool's unit tests expect of
Prometheus (tests/chargeback_rules_test.yaml): MetricsQL reads the same rules alike."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone

import pytest
from agent import REPO, free_port
from conftest import need_tool
from waiting import PATIENCE, wait_until

RULES = REPO / "alerts" / "l9gpu-chargeback.rules.yaml"
H = 3600


def series(name: str, labels: str, values: list[float | None], t0: int) -> str:
    """Prometheus text with millisecond timestamps, one sample a minute from ``t0``."""
    return "".join(f"{name}{{{labels}}} {v} {(t0 + 60 * i) * 1000}\n" for i, v in enumerate(values) if v is not None)


def history(t0: int) -> str:
    """The unit tests' three containers: all along; from 90 min; restarted at 91 min."""
    a = [60.0 * i for i in range(181)]
    b = [None] * 90 + [60.0 * i for i in range(91)]
    c = [60.0 * i for i in range(91)] + [60.0 * i for i in range(90)]
    name = "container_gpu_allocation_seconds_total"
    return (series(name, 'node="n1",gpu="0",namespace="a",pod="p-a",model="H100"', a, t0)
            + series(name, 'node="n1",gpu="1",namespace="a",pod="p-b",model="H100"', b, t0)
            + series(name, 'node="n2",gpu="0",namespace="b",pod="p-c",model="A100"', c, t0))


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=PATIENCE / 2) as resp:
        return resp.read()


def test_vmalert_replays_the_chargeback_rules_on_victoriametrics(tmp_path):
    vm_bin, vmalert_bin = need_tool("victoria-metrics"), need_tool("vmalert")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    vm = subprocess.Popen([vm_bin, f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
                           "-retentionPeriod=100y", "-search.disableCache", "-search.latencyOffset=0s"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        def ready() -> bool:
            try:
                return get(base + "/health") == b"OK"
            except OSError:
                return False

        wait_until(ready, what="VictoriaMetrics answering")
        t0 = (int(time.time()) // H - 6) * H
        body = history(t0).encode()
        urllib.request.urlopen(urllib.request.Request(base + "/api/v1/import/prometheus", data=body),
                               timeout=PATIENCE / 2).read()
        get(base + "/internal/force_flush")
        iso = [datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") for t in (t0, t0 + 3 * H)]
        replay = subprocess.run([vmalert_bin, f"-rule={RULES}", f"-datasource.url={base}",
                                 f"-remoteWrite.url={base}", f"-replay.timeFrom={iso[0]}", f"-replay.timeTo={iso[1]}",
                                 # the served-model rules read the rules before them: each rule's
                                 # results written before the next is evaluated
                                 "-replay.rulesDelay=1s", "-remoteWrite.flushInterval=200ms"],
                                capture_output=True, text=True, timeout=4 * PATIENCE)
        assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]
        def recorded(record: str) -> dict[tuple[str, int], float]:
            get(base + "/internal/force_flush")
            query = urllib.parse.urlencode({"match[]": record, "start": t0, "end": t0 + 4 * H})
            out = {}
            for line in get(base + "/api/v1/export?" + query).decode().splitlines():
                doc = json.loads(line)
                for ts, v in zip(doc["timestamps"], doc["values"]):
                    out[(doc["metric"]["namespace"], ts // 1000 - t0)] = v
            return out if len({t for _, t in out}) >= 3 else {}

        got = wait_until(lambda: recorded("namespace_model:l9gpu_gpu_allocated_seconds:increase1h"),
                         what="the recorded hours in VictoriaMetrics")
        # per served model: these pods serve none, so each hour is the namespace's, in (none),
        # read through the per-pod records of the same evaluation
        by_model = wait_until(lambda: recorded("namespace_model_name_model:l9gpu_gpu_allocated_seconds:increase1h"),
                              what="the served-model rules' hours in VictoriaMetrics")
    finally:
        vm.terminate()
        vm.wait(PATIENCE / 2)
    # the same hours as in promtool's unit tests: a all along, b from 0 at 90 min, c through
    # its restart (30 min before, 29 after)
    assert {key: got[key] for key in got if key[1] in (H, 2 * H, 3 * H)} == pytest.approx(
        {("a", H): 3600, ("b", H): 3600, ("a", 2 * H): 5400, ("b", 2 * H): 3540, ("a", 3 * H): 7200,
         ("b", 3 * H): 3600})
    assert {key: by_model[key] for key in by_model if key[1] in (H, 2 * H, 3 * H)} == pytest.approx(
        {key: got[key] for key in got if key[1] in (H, 2 * H, 3 * H)})
