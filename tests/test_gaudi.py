"""The Gaudi backend: the hl-smi CSV parser, a stand-in hl-smi, and fixture /proc trees."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.devices.base import Backend, BackendUnavailable
from exporter.devices.gaudi.backend import (
    GaudiBackend,
    HlSmiError,
    HlSmiRow,
    format_hl_smi_row,
    parse_hl_smi_csv,
    scan_accel_processes,
)

FAKE_HL_SMI = str(Path(__file__).parent / "fakes" / "hl-smi")
MiB = 2**20

LINE0 = "0, 01P0-HL2080A0-15-TNF0A8-03-07-02, AM43000131, HL-225, 0000:33:00.0, 1.17.0-e3a4b6f, 17, 2048, 98304, 215, 34"
LINE1 = "1, 01P0-HL2080A0-15-TNF0A8-03-07-05, AM43000162, HL-225, 0000:9a:00.0, 1.17.0-e3a4b6f, 0, 768, 98304, 98, 29"


def make_proc(root: Path, holders: dict[int, list[str]]) -> Path:
    """A fixture /proc: ``holders`` maps pid -> link targets of its open fds."""
    for pid, targets in holders.items():
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True)
        for n, target in enumerate(["/dev/null", *targets]):
            os.symlink(target, fd / str(n))
    (root / "self").mkdir(exist_ok=True)  # non-numeric entries are ignored
    return root


@pytest.fixture
def hl_smi(monkeypatch):
    """Point the stand-in at given output; returns a setter."""
    for name in ("FAKE_HL_SMI_OUTPUT", "FAKE_HL_SMI_OUTPUT_FILE", "FAKE_HL_SMI_SLEEP", "FAKE_HL_SMI_EXIT"):
        monkeypatch.delenv(name, raising=False)

    def set_output(text: str | None = None, **env: str) -> str:
        if text is not None:
            monkeypatch.setenv("FAKE_HL_SMI_OUTPUT", text)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return FAKE_HL_SMI

    return set_output


# ---- parser -----------------------------------------------------------------------

def test_parse_real_format_in_base_units():
    rows, problems = parse_hl_smi_csv(LINE0 + "\n" + LINE1 + "\n")
    assert problems == []
    assert [r.index for r in rows] == [0, 1]
    row = rows[0]
    assert row.uuid == "01P0-HL2080A0-15-TNF0A8-03-07-02"
    assert row.serial == "AM43000131"
    assert row.name == "HL-225"
    assert row.bus_id == "0000:33:00.0"
    assert row.driver_version == "1.17.0-e3a4b6f"
    assert row.utilization == pytest.approx(0.17)
    assert row.memory_used_bytes == 2048 * MiB
    assert row.memory_total_bytes == 98304 * MiB
    assert row.power_watts == 215.0
    assert row.temperature_celsius == 34.0


def test_parse_na_fields_are_none():
    rows, problems = parse_hl_smi_csv("0, U, S, HL-325L, 0000:4d:00.0, 1.18.0, N/A, N/A, 131072, [N/A], N/A\n")
    assert problems == []
    (row,) = rows
    assert row.utilization is None and row.memory_used_bytes is None and row.power_watts is None
    assert row.temperature_celsius is None
    assert row.memory_total_bytes == 131072 * MiB


def test_parse_tolerates_units_when_nounits_is_ignored():
    (row,), problems = parse_hl_smi_csv("0, U, S, HL-225, B, D, 17 %, 2048 MiB, 98304 MiB, 215 W, 34 C")
    assert problems == [] and row.memory_used_bytes == 2048 * MiB and row.power_watts == 215.0


def test_parse_skips_and_counts_malformed_lines():
    lines = [
        LINE0,
        "2, only, four, fields",
        "3, U, S, HL-225, B, D, busy, 1, 2, 3, 4",  # non-numeric utilisation
        "x, U, S, HL-225, B, D, 1, 1, 2, 3, 4",  # no index
        "",
        LINE1,
        LINE1,  # repeated index
    ]
    text = "\n".join(lines)
    rows, problems = parse_hl_smi_csv(text)
    assert [r.index for r in rows] == [0, 1]
    assert len(problems) == 4
    assert problems[0].startswith("line 2:")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parser_never_raises(text):
    rows, problems = parse_hl_smi_csv(text)
    assert isinstance(rows, list) and isinstance(problems, list)


_safe_text = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters='",'),
    min_size=1, max_size=30,
).filter(lambda s: s.upper() not in ("N/A", "[N/A]", "NA"))
_maybe = lambda strategy: st.one_of(st.none(), strategy)


@st.composite
def hl_rows(draw):
    indices = draw(st.lists(st.integers(0, 63), min_size=1, max_size=8, unique=True))
    rows = []
    for index in indices:
        rows.append(HlSmiRow(
            index=index, uuid=draw(_safe_text), serial=draw(_safe_text), name=draw(_safe_text),
            bus_id=draw(_safe_text), driver_version=draw(_safe_text),
            utilization=draw(_maybe(st.integers(0, 100).map(lambda p: p / 100.0))),
            memory_used_bytes=draw(_maybe(st.integers(0, 2**24).map(lambda m: m * MiB))),
            memory_total_bytes=draw(_maybe(st.integers(0, 2**24).map(lambda m: m * MiB))),
            power_watts=draw(_maybe(st.floats(0, 5000, allow_nan=False))),
            temperature_celsius=draw(_maybe(st.floats(0, 200, allow_nan=False))),
        ))
    return rows


@settings(max_examples=200, deadline=None)
@given(hl_rows(), st.sampled_from(["\n", "\r\n"]))
def test_parser_round_trips_well_formed_rows(rows, newline):
    text = newline.join(format_hl_smi_row(r) for r in rows) + newline
    parsed, problems = parse_hl_smi_csv(text)
    assert problems == []
    assert len(parsed) == len(rows)
    for got, want in zip(parsed, rows):
        assert got.utilization == pytest.approx(want.utilization)
        assert got == HlSmiRow(**{**want.__dict__, "utilization": got.utilization})


@settings(max_examples=100, deadline=None)
@given(hl_rows(), st.lists(st.text(max_size=60), max_size=5))
def test_garbage_lines_do_not_hide_good_rows(rows, garbage):
    lines = [format_hl_smi_row(r) for r in rows]
    for i, junk in enumerate(garbage):
        lines.insert(i * 2 % (len(lines) + 1), junk.replace("\n", " ").replace("\r", " "))
    parsed, _ = parse_hl_smi_csv("\n".join(lines))
    assert {r.index for r in rows} <= {r.index for r in parsed}  # good rows survive
    # A junk line may parse as a device only if it is itself well formed.
    assert all(isinstance(r, HlSmiRow) for r in parsed)


# ---- /proc scan -------------------------------------------------------------------

def test_scan_finds_compute_nodes_not_control_nodes(tmp_path):
    proc = make_proc(tmp_path / "proc", {
        100: ["/dev/accel/accel0", "/dev/accel/accel0", "socket:[123]"],
        200: ["/dev/accel/accel1", "/dev/accel/accel_controlD1"],
        300: ["/dev/accel/accel_controlD0"],  # a monitoring tool, not a workload
        400: ["/dev/hl3"],  # the older out-of-tree driver
        500: ["/dev/hl_controlD3", "/dev/accel/accel12x"],
    })
    assert scan_accel_processes(str(proc)) == {0: {100}, 1: {200}, 3: {400}}


def test_scan_of_missing_root_is_empty(tmp_path):
    assert scan_accel_processes(str(tmp_path / "nope")) == {}


# ---- backend ----------------------------------------------------------------------

def test_backend_protocol():
    backend = GaudiBackend()
    assert isinstance(backend, Backend) and backend.name == "gaudi"


def test_backend_samples_devices_and_processes(tmp_path, hl_smi):
    proc = make_proc(tmp_path / "proc", {4242: ["/dev/accel/accel0"], 4343: ["/dev/accel/accel1"],
                                         4444: ["/dev/accel/accel1"]})
    backend = GaudiBackend(hl_smi=hl_smi(), proc_root=str(proc))
    backend.open()
    dev0, dev1 = backend.sample(1.0)
    assert dev0.up and dev0.vendor == "gaudi" and dev0.model == "HL-225"
    assert dev0.serial == "AM43000131" and dev0.pci_bus_id == "0000:33:00.0"
    assert dev0.uuid == "01P0-HL2080A0-15-TNF0A8-03-07-02"
    assert dev0.utilization == pytest.approx(0.17)
    assert dev0.memory_used_bytes == 2048 * MiB and dev0.memory_total_bytes == 98304 * MiB
    assert dev0.power_watts == 215.0 and dev0.temperature_celsius == 34.0
    assert dev0.energy_joules is None  # hl-smi has no energy counter; the agent integrates power
    assert [p.pid for p in dev0.processes] == [4242]
    assert [p.pid for p in dev1.processes] == [4343, 4444]
    assert all(p.used_memory_bytes is None and p.sm_utilization is None for p in dev1.processes)
    assert backend.errors() == {}


def test_malformed_line_does_not_hide_other_devices(tmp_path, hl_smi):
    path = tmp_path / "out.csv"
    path.write_text(LINE0 + "\n" + LINE1 + "\n")
    backend = GaudiBackend(hl_smi=hl_smi(FAKE_HL_SMI_OUTPUT_FILE=str(path)), proc_root=str(tmp_path))
    backend.open()
    path.write_text(LINE0 + "\n1, 01P0, AM43000162, HL-225, 0000:9a:00.0, garbled\n")
    dev0, dev1 = backend.sample(2.0)
    assert dev0.up and dev0.power_watts == 215.0
    assert not dev1.up and dev1.serial == "AM43000162" and "missing" in dev1.error
    assert backend.errors() == {"malformed_line": 1}


def test_na_values_omitted(tmp_path, hl_smi):
    out = "0, U0, S0, HL-225, 0000:33:00.0, 1.17.0, N/A, 2048, 98304, N/A, N/A\n"
    backend = GaudiBackend(hl_smi=hl_smi(out), proc_root=str(tmp_path))
    backend.open()
    (dev,) = backend.sample(1.0)
    assert dev.up and dev.utilization is None and dev.power_watts is None
    assert dev.temperature_celsius is None and dev.memory_used_bytes == 2048 * MiB


def test_hung_hl_smi_is_killed_and_counted(tmp_path, hl_smi):
    # 3 s: ample for the healthy call a busy machine makes (a Python script starting up)
    backend = GaudiBackend(hl_smi=hl_smi(), hl_smi_timeout=3.0, proc_root=str(tmp_path))
    backend.open()
    hl_smi(FAKE_HL_SMI_SLEEP="30")
    started = time.monotonic()
    with pytest.raises(HlSmiError, match="did not answer within 3s"):
        backend.sample(1.0)
    assert time.monotonic() - started < 15  # killed at its timeout, not after its 30 s
    assert backend.errors() == {"timeout": 1}


def test_hung_hl_smi_at_open_is_unavailable(tmp_path, hl_smi):
    backend = GaudiBackend(hl_smi=hl_smi(FAKE_HL_SMI_SLEEP="30"), hl_smi_timeout=0.3, proc_root=str(tmp_path))
    with pytest.raises(BackendUnavailable, match="did not answer"):
        backend.open()


def test_missing_hl_smi_names_the_path(tmp_path):
    missing = str(tmp_path / "bin" / "hl-smi")
    backend = GaudiBackend(hl_smi=missing)
    with pytest.raises(BackendUnavailable, match=missing):
        backend.open()
    assert backend.errors() == {"not_found": 1}
    with pytest.raises(BackendUnavailable, match="not found"):
        GaudiBackend(hl_smi="hl-smi-that-is-not-on-path").open()


def test_hl_smi_removed_at_run_time(tmp_path, hl_smi):
    copy = tmp_path / "hl-smi"
    copy.write_text(Path(FAKE_HL_SMI).read_text())
    copy.chmod(0o755)
    backend = GaudiBackend(hl_smi=str(copy), proc_root=str(tmp_path))
    backend.open()
    copy.unlink()
    with pytest.raises(HlSmiError, match="not found"):
        backend.sample(1.0)
    assert backend.errors() == {"not_found": 1}


def test_hl_smi_failure_exit_status(tmp_path, hl_smi):
    backend = GaudiBackend(hl_smi=hl_smi(), proc_root=str(tmp_path))
    backend.open()
    hl_smi(FAKE_HL_SMI_EXIT="3")
    with pytest.raises(HlSmiError, match="status 3"):
        backend.sample(1.0)
    assert backend.errors() == {"exit_status": 1}


def test_no_devices_is_unavailable(tmp_path, hl_smi):
    with pytest.raises(BackendUnavailable, match="no Gaudi devices"):
        GaudiBackend(hl_smi=hl_smi(""), proc_root=str(tmp_path)).open()


# ---- wiring -----------------------------------------------------------------------

def test_open_backends_passes_cli_options(tmp_path, hl_smi):
    from exporter.app.cli import build_parser
    from exporter.devices import open_backends, options_from

    proc = make_proc(tmp_path / "proc", {77: ["/dev/accel/accel1"]})
    args = build_parser().parse_args(["serve", "--backend", "gaudi", "--hl-smi", hl_smi(), "--hl-smi-timeout", "2s",
                                      "--proc-root", str(proc)])
    [backend] = open_backends(args.backend, options_from(args))
    assert isinstance(backend, GaudiBackend) and backend.hl_smi_timeout == 2.0
    assert [p.pid for p in backend.sample(1.0)[1].processes] == [77]


def test_mixed_node_amd_and_gaudi(tmp_path, hl_smi, monkeypatch):
    from fakes.amdsmi_fake import FakeAmdSmi

    from exporter.devices import open_backends

    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi())
    backends = open_backends("amd,gaudi", {"gaudi": {"hl_smi": hl_smi(), "proc_root": str(tmp_path)}})
    assert [b.name for b in backends] == ["amd", "gaudi"]
    vendors = [d.vendor for b in backends for d in b.sample(1.0)]
    assert vendors == ["amd", "gaudi", "gaudi"]


def test_auto_probe_falls_through_to_gaudi(tmp_path, hl_smi, monkeypatch):
    from exporter.devices import open_backends

    monkeypatch.setitem(sys.modules, "amdsmi", None)  # no ROCm on this node
    try:
        [backend] = open_backends("auto", {"gaudi": {"hl_smi": hl_smi(), "proc_root": str(tmp_path)}})
    except BackendUnavailable as exc:  # pragma: no cover - only with an NVIDIA GPU present
        pytest.fail(str(exc))
    if backend.name == "nvml":  # pragma: no cover - a machine with an NVIDIA GPU
        pytest.skip("an NVIDIA GPU answers first on this machine")
    assert backend.name == "gaudi"
