"""The stall thresholds: one table, its doc, and the signature of one pass (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.core.model import DeviceSample, ProcessSample, frozen_mapping
from exporter.stall import parse_stall_after
from exporter.stall import policy as p
from exporter.stall.signature import NO_GPM, read

REPO = Path(__file__).resolve().parent.parent


def test_training_md_prints_the_threshold_table() -> None:
    text = (REPO / "docs" / "TRAINING.md").read_text()
    start = "<!-- stall thresholds: python -m exporter.stall --markdown -->\n"
    end = "<!-- end of stall thresholds -->"
    assert start in text and end in text
    assert text.split(start, 1)[1].split(end, 1)[0] == p.markdown(), (
        "docs/TRAINING.md's threshold table is stale: paste `python -m exporter.stall --markdown`")


def test_every_threshold_names_a_listed_source() -> None:
    for t in p.THRESHOLDS:
        assert t.why and t.source
        assert all(name.strip() in p.SOURCES for name in t.source.split(",")), t.name
    assert p.STALL_AFTER < 600  # under PyTorch's 10-minute NCCL timeout


@pytest.mark.parametrize("text,seconds", [("5m", 300.0), ("90s", 90.0), ("off", None), ("OFF", None)])
def test_stall_after_takes_a_duration_or_off(text, seconds) -> None:
    assert parse_stall_after(text) == seconds


@pytest.mark.parametrize("text", ["0", "soon", "-5m"])
def test_stall_after_refuses_what_is_not_a_duration(text) -> None:
    with pytest.raises(ValueError, match="duration such as 5m"):
        parse_stall_after(text)


def _gpu(utilization=1.0, tensor=0.0, dram=0.02, power=160.0, limit=700.0, pcie=1e5, throttle=None,
         processes=(ProcessSample(7, 2**30),), gpm=True, **kw) -> DeviceSample:
    values = {"graphics_active": utilization, "tensor_active": tensor, "dram_active": dram,
              "pcie_tx_bytes_per_second": pcie, "pcie_rx_bytes_per_second": pcie} if gpm else {}
    return DeviceSample(0, "GPU-0", utilization=utilization, memory_utilization=dram, power_watts=power,
                        power_limit_watts=limit, gpm=frozen_mapping(values), processes=tuple(processes),
                        throttle_reasons=frozen_mapping(throttle or {"hw_thermal_slowdown": False}), **kw)


def test_a_wedged_collective_matches() -> None:
    reading = read(_gpu())
    assert reading.judged and reading.matched and reading.why_not == "" and reading.absent == ()
    assert reading.signals["power_ratio"] == pytest.approx(160 / 700)


@pytest.mark.parametrize("changes,why", [
    ({"utilization": 0.0}, "utilisation 0% < 95%"),             # checkpoint, data-loader stall, zombie
    ({"utilization": 0.5, "tensor": 0.3}, "utilisation 50%"),  # evaluation
    ({"tensor": 0.005, "dram": 0.4, "power": 500.0}, "DRAM activity 40% > 5%"),  # FP32 compute, low tensor
    ({"power": 300.0}, "power of its limit 43% > 35%"),
    ({"pcie": 5e8}, "PCIe 500 MB/s > 20 MB/s"),
    ({"throttle": {"hw_thermal_slowdown": True}}, "clocks held down (hw_thermal_slowdown)"),
])
def test_what_is_not_a_stall_says_why(changes, why) -> None:
    reading = read(_gpu(**changes))
    assert reading.judged and not reading.matched and why in reading.why_not


def test_a_gpu_no_process_holds_is_not_judged() -> None:
    reading = read(_gpu(processes=()))
    assert not reading.judged and not reading.matched and reading.why_not == "no process holds it"


def test_without_gpm_it_says_so_and_judges_on_what_remains() -> None:
    reading = read(_gpu(gpm=False), pcie_counter_rate=1e3)
    assert reading.judged and reading.matched and NO_GPM in reading.absent
    assert "tensor_active" not in reading.signals and reading.signals["dram_active"] == 0.02
    assert not read(_gpu(gpm=False, power=600.0), pcie_counter_rate=1e3).matched


def test_a_mig_instance_without_utilisation_uses_graphics_activity() -> None:
    mig = _gpu(power=None, gpu_instance="1")
    mig = DeviceSample(**{**mig.__dict__, "utilization": None})
    reading = read(mig)
    assert reading.judged and reading.matched and reading.signals["utilization"] == 1.0
    assert any("MIG" in a for a in reading.absent)


def test_the_banner_names_the_job_and_rank_and_escapes_what_users_chose() -> None:
    from exporter.core.model import Workload
    from exporter.stall.messages import headline
    from exporter.stall.tracker import Stall
    from exporter.web.page import render_main

    rank = Workload(kind="kubernetes", namespace="batch", pod="trainer-3", container="pytorch",
                    training_job="llama-pretrain", training_rank="13")
    stall = Stall("n", 5, "GPU-5", "", "GPU-5", began=1000.0, declared=1300.0, workloads=(rank,), signals={})
    assert headline(stall, 1420.0) == "GPU 5 busy with no work for 7m 0s: batch/trainer-3 (job llama-pretrain, rank 13)"
    evil = Workload(kind="kubernetes", namespace="x", pod="<img src=x onerror=alert(1)>")
    text = headline(Stall("n", 1, "GPU-1", "", "GPU-1", 0.0, 300.0, (evil,), {}), 300.0)
    doc = {"seq": 1, "timestamp": 1.0, "gpus": [{"index": 1, "uuid": "GPU-1", "gpu_instance": "",
                                                 "stall": {"state": "stalled", "headline": text}}]}
    page = render_main(doc)
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page and "<b>stalled</b>" in page
