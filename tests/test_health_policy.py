"""The health verdict: each reason, and how it clears, as a GPU's driver would tell it."""

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.health import (
    HEALTHY_VERDICT,
    Ecc,
    Fabric,
    FabricState,
    HealthSignals,
    HealthState,
    NvLink,
    Pcie,
    RecoveryAction,
    RowRemap,
    assess,
    mig_verdicts,
)
from exporter.health import policy as p

DOC = Path(__file__).resolve().parent.parent / "docs" / "HEALTH.md"
BOOT = "6f1c2a4e-0000-4000-8000-000000000001"
HEALTH_INTERVAL = 30.0


def signals(**kw):
    kw.setdefault("boot_id", BOOT)
    return HealthSignals(**kw)


class Gpu:
    """One GPU's verdict driven pass by pass, with a health read every 30 s (the slow schedule)."""

    def __init__(self, state=None):
        self.state = state or HealthState()
        self.now = 1000.0
        self.verdict = HEALTHY_VERDICT

    def tick(self, seconds=HEALTH_INTERVAL, read=None, xids=(), utilization=0.0, stuck=False):
        self.now += seconds
        self.state, self.verdict = assess(self.state, self.now, read, xids, utilization, stuck)
        return self.verdict


# ---- row remapping ---------------------------------------------------------------------------

def test_a_pending_remap_asks_for_a_reset_and_clears_once_the_reset_applied_it():
    gpu = Gpu()
    v = gpu.tick(read=signals(row_remap=RowRemap(correctable=0, uncorrectable=1, pending=True, failure=False)),
                 xids=[63])
    assert v.reason_names == ("row_remap_pending",)
    assert (v.state, v.action) == ("degraded", "reset_gpu")
    for _ in range(20):  # passes without a health read keep the last read's reasons
        assert gpu.tick(seconds=1.0).reason_names == ("row_remap_pending",)
    assert gpu.tick(read=signals(row_remap=RowRemap(0, 1, True, False))).reason_names == ("row_remap_pending",)
    # after the reset: the remap is active, nothing pending
    v = gpu.tick(read=signals(row_remap=RowRemap(0, 1, False, False)))
    assert v == HEALTHY_VERDICT
    assert gpu.state.transitions == 1


def test_a_remap_failure_or_a_bank_without_spares_is_for_support():
    v = Gpu().tick(read=signals(row_remap=RowRemap(0, 9, False, True, banks_no_spare=2)))
    assert v.reason_names == ("row_remap_failure", "row_remap_no_spare")
    assert (v.state, v.action) == ("unhealthy", "contact_support")
    assert "2 banks" in v.reasons[1].text


def test_a_restart_with_a_pending_remap_keeps_it():
    gpu = Gpu()
    gpu.tick(read=signals(row_remap=RowRemap(0, 1, True, False)), xids=[48, 63])
    assert gpu.verdict.action == "drain_and_reset"
    restarted = Gpu()  # a new agent: empty state, no XIDs from before it started
    v = restarted.tick(read=signals(row_remap=RowRemap(0, 1, True, False)))
    assert v.reason_names == ("row_remap_pending",)
    assert v.action == "reset_gpu"


# ---- PCIe ------------------------------------------------------------------------------------

def test_a_narrow_link_under_load_is_downgraded_once_it_lasts_and_an_idle_gen1_link_is_not():
    narrow, idle = Gpu(), Gpu()
    for reads in range(1, 4):
        v = narrow.tick(read=signals(pcie=Pcie(5, 5, 8, 16, 0)), utilization=0.95)
        i = idle.tick(read=signals(pcie=Pcie(1, 5, 16, 16, 0)), utilization=0.0)
        assert i == HEALTHY_VERDICT
        assert v.reason_names == (() if reads < 3 else ("pcie_downgraded",))
    assert "x8 of x16" in narrow.verdict.reasons[0].text
    assert narrow.verdict.action == "inspect_hardware"
    # the width comes back: cleared at the next read
    assert narrow.tick(read=signals(pcie=Pcie(5, 5, 16, 16, 0)), utilization=0.95) == HEALTHY_VERDICT


def test_a_generation_below_max_counts_only_while_busy():
    gpu = Gpu()
    v = gpu.tick(read=signals(pcie=Pcie(4, 5, 16, 16, 0)), utilization=0.9)
    assert v.reason_names == ("pcie_downgraded",) and "gen 4 of 5 while busy" in v.reasons[0].text
    assert gpu.tick(read=signals(pcie=Pcie(1, 5, 16, 16, 0)), utilization=0.02) == HEALTHY_VERDICT


def test_pcie_replays_count_by_their_rate_not_their_lifetime_total():
    gpu = Gpu()
    assert gpu.tick(read=signals(pcie=Pcie(5, 5, 16, 16, 10_000))) == HEALTHY_VERDICT  # old replays
    assert gpu.tick(read=signals(pcie=Pcie(5, 5, 16, 16, 10_003))) == HEALTHY_VERDICT  # 6/min
    v = gpu.tick(read=signals(pcie=Pcie(5, 5, 16, 16, 10_008)))  # 10/min > DCGM's 8
    assert v.reason_names == ("pcie_replays",)
    for _ in range(19):
        assert gpu.tick(read=signals(pcie=Pcie(5, 5, 16, 16, 10_008))).reason_names == ("pcie_replays",)
    assert gpu.tick(read=signals(pcie=Pcie(5, 5, 16, 16, 10_008))) == HEALTHY_VERDICT  # 10 quiet minutes


# ---- NVLink ----------------------------------------------------------------------------------

def _links(replay=0, down=()):
    return tuple(NvLink(n, up=n not in down, replay=replay if n == 2 else 0, recovery=0, crc_flit=5, crc_data=5)
                 for n in range(18))


def test_nvlink_replay_errors_rising_make_the_gpu_unhealthy_and_a_quiet_window_clears_it():
    gpu = Gpu()
    assert gpu.tick(read=signals(nvlinks=_links(replay=40))) == HEALTHY_VERDICT  # lifetime errors only
    assert gpu.tick(read=signals(nvlinks=_links(replay=40))) == HEALTHY_VERDICT
    v = gpu.tick(read=signals(nvlinks=_links(replay=41)))
    assert v.reason_names == ("nvlink_errors",) and "link 2" in v.reasons[0].text
    assert (v.state, v.action) == ("unhealthy", "reset_gpu")
    t_rise = gpu.now
    while gpu.now - t_rise < 600 - HEALTH_INTERVAL:
        assert gpu.tick(read=signals(nvlinks=_links(replay=41))).reason_names == ("nvlink_errors",)
    assert gpu.tick(read=signals(nvlinks=_links(replay=41))) == HEALTHY_VERDICT


def test_a_link_down_while_the_others_are_up():
    v = Gpu().tick(read=signals(nvlinks=_links(down=(5,))))
    assert v.reason_names == ("nvlink_down",) and "link 5 down, 17 up" in v.reasons[0].text
    assert Gpu().tick(read=signals(nvlinks=_links(down=tuple(range(18))))) == HEALTHY_VERDICT  # no NVLink in use


# ---- XIDs ------------------------------------------------------------------------------------

def test_xid_79_then_the_gpu_lost_needs_a_reboot_and_clears_after_it():
    gpu = Gpu()
    v = gpu.tick(seconds=1.0, xids=[79])
    assert (v.reason_names, v.action) == (("xid_79",), "reboot_node")
    v = gpu.tick(read=signals(gpu_lost=True))
    assert v.reason_names == ("gpu_lost", "xid_79") and v.state == "unhealthy"
    assert gpu.tick(seconds=3600, read=signals(gpu_lost=True)).reason_names == ("gpu_lost", "xid_79")
    v = gpu.tick(read=signals(boot_id="6f1c2a4e-0000-4000-8000-000000000002"))  # the node rebooted
    assert v == HEALTHY_VERDICT


def test_xid_31_clears_after_ten_quiet_minutes_not_before():
    gpu = Gpu()
    v = gpu.tick(seconds=1.0, xids=[31])
    assert (v.state, v.action, v.reason_names) == ("degraded", "restart_app", ("xid_31",))
    start = gpu.now
    gpu.tick(seconds=300.0, xids=[31])  # a repeat restarts the window
    assert gpu.tick(seconds=599.0).reason_names == ("xid_31",)
    assert gpu.tick(seconds=1.0) == HEALTHY_VERDICT
    assert gpu.now - start == 900.0


def test_a_restart_after_an_xid_31_forgets_it():
    gpu = Gpu()
    gpu.tick(seconds=1.0, read=signals(), xids=[31])
    assert gpu.verdict.reason_names == ("xid_31",)
    assert Gpu().tick(read=signals()) == HEALTHY_VERDICT


def test_a_reset_xid_stays_until_the_driver_shows_the_reset():
    gpu = Gpu()
    gpu.tick(read=signals(energy_mj=9_000_000, ecc=Ecc(volatile_corrected=3, volatile_uncorrected=0)), xids=[119])
    for _ in range(100):
        assert gpu.tick(read=signals(energy_mj=9_100_000, ecc=Ecc(volatile_corrected=3,
                                                                  volatile_uncorrected=0))).action == "reset_gpu"
    # nvidia-smi -r: the driver's counters start again
    assert gpu.tick(read=signals(energy_mj=1_000, ecc=Ecc(volatile_corrected=0, volatile_uncorrected=0))) \
        == HEALTHY_VERDICT


def test_xid_48_alone_resets_and_with_63_or_64_drains_and_resets():
    alone = Gpu().tick(seconds=1.0, xids=[48])
    assert (alone.reason_names, alone.action) == (("xid_48",), "reset_gpu")
    gpu = Gpu()
    gpu.tick(seconds=1.0, xids=[48])
    v = gpu.tick(seconds=1.0, xids=[64])
    assert v.reason_names == ("xid_48", "xid_64") and v.action == "drain_and_reset"
    assert Gpu().tick(seconds=1.0, xids=[63, 48]).action == "drain_and_reset"


def test_xid_154_follows_the_recovery_action_field():
    gpu = Gpu()
    gpu.tick(read=signals(recovery_action=RecoveryAction.NONE))
    v = gpu.tick(read=signals(recovery_action=RecoveryAction.NODE_REBOOT), xids=[154])
    assert v.reason_names == ("recovery_action",)
    assert (v.action, v.state) == ("reboot_node", "unhealthy") and "node_reboot" in v.reasons[0].text
    drain = gpu.tick(read=signals(recovery_action=RecoveryAction.DRAIN_AND_RESET))
    assert drain.action == "drain_and_reset"
    assert gpu.tick(read=signals(recovery_action=RecoveryAction.NONE)) == HEALTHY_VERDICT
    # a driver without the field: Xid 154 itself asks for a reset
    old = Gpu().tick(seconds=1.0, read=signals(), xids=[154])
    assert (old.reason_names, old.action) == (("xid_154",), "reset_gpu")


def test_an_nvlink5_xid_clears_when_the_driver_asks_for_nothing():
    gpu = Gpu()
    gpu.tick(read=signals(recovery_action=0), xids=[145])
    assert gpu.verdict.reason_names == ("xid_145",)
    assert gpu.tick(read=signals(recovery_action=0)).reason_names == ("xid_145",)  # 30 s: not settled
    assert gpu.tick(read=signals(recovery_action=0)) == HEALTHY_VERDICT


def test_catalog_ignore_xids_are_counted_only_and_unknown_ones_are_inspected():
    assert Gpu().tick(seconds=1.0, xids=[43, 92, 63]) == HEALTHY_VERDICT
    v = Gpu().tick(seconds=1.0, xids=[999])
    assert (v.reason_names, v.action) == (("xid_other",), "inspect_hardware")


def test_stuck_in_a_driver_call_lasts_as_long_as_the_call():
    gpu = Gpu()
    assert gpu.tick(seconds=1.0, stuck=True).reason_names == ("stuck_in_driver_call",)
    assert gpu.tick(seconds=1.0, stuck=False) == HEALTHY_VERDICT


def test_a_fabric_registration_that_never_finishes():
    gpu = Gpu()
    for _ in range(2):
        assert gpu.tick(read=signals(fabric=Fabric(FabricState.IN_PROGRESS))) == HEALTHY_VERDICT
    assert gpu.tick(read=signals(fabric=Fabric(FabricState.IN_PROGRESS))).reason_names == ("fabric_unhealthy",)
    assert gpu.tick(read=signals(fabric=Fabric(FabricState.COMPLETED, True, False))) == HEALTHY_VERDICT


# ---- garbage ---------------------------------------------------------------------------------

@pytest.mark.parametrize("read, field", [
    (signals(pcie=Pcie(7, 5, 16, 16)), "pcie.generation"),
    (signals(pcie=Pcie(5, 5, 0, 16)), "pcie.width"),
    (signals(pcie=Pcie(5, 5, 64, 16)), "pcie.width"),
    (signals(pcie=Pcie(5, 5, 32, 16)), "pcie.width"),
    (signals(row_remap=RowRemap(pending=7)), "row_remap.pending"),
    (signals(row_remap=RowRemap(banks_no_spare=-1)), "row_remap.banks_no_spare"),
    (signals(ecc=Ecc(volatile_uncorrected=math.nan)), "ecc.volatile_uncorrected"),
    (signals(nvlinks=(NvLink(0, True, replay=-5), NvLink(1, True))), "nvlink[0].replay"),
    (signals(recovery_action=-1), "recovery_action"),
    (signals(fabric=Fabric(state=42)), "fabric.state"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_a_garbage_answer_gives_no_verdict_and_one_problem_logged_once(read, field):
    gpu = Gpu()
    v = gpu.tick(read=read, utilization=1.0)
    assert v.reasons == ()
    assert len(v.problems) == 1 and v.problems[0].startswith(field + ":")
    assert gpu.tick(read=read, utilization=1.0).problems == ()  # logged once


def test_garbage_xid_codes_are_reported_not_raised():
    v = Gpu().tick(seconds=1.0, xids=[-3, "x", None, 31])
    assert v.reason_names == ("xid_31",) and len(v.problems) == 1


# ---- MIG, flapping ---------------------------------------------------------------------------

def test_mig_instances_inherit_their_parents_verdict():
    gpu = Gpu()
    parent = gpu.tick(read=signals(row_remap=RowRemap(0, 1, True, False)))
    got = mig_verdicts({"GPU-a": parent, "GPU-b": HEALTHY_VERDICT},
                       {"MIG-1": "GPU-a", "MIG-2": "GPU-a", "MIG-3": "GPU-b", "MIG-4": "GPU-gone"})
    assert got["MIG-1"].reason_names == got["MIG-2"].reason_names == ("row_remap_pending",)
    assert got["MIG-3"] == HEALTHY_VERDICT and "MIG-4" not in got


def test_each_change_of_state_is_one_transition():
    gpu = Gpu()
    for _ in range(3):
        gpu.tick(seconds=1.0, stuck=True)
        gpu.tick(seconds=1.0, stuck=False)
    assert gpu.state.transitions == 5  # the first verdict is where it starts, not a change
    assert dict(gpu.verdict.state_values()) == {"healthy": 1, "degraded": 0, "unhealthy": 0}
    assert sum(v for _, v in gpu.verdict.action_values()) == 1


# ---- the table and the doc -------------------------------------------------------------------

def test_the_health_doc_carries_the_policy_table():
    text = DOC.read_text(encoding="utf-8")
    start = "<!-- policy table: python -m exporter.health --markdown -->\n"
    end = "<!-- end of policy table -->"
    assert start in text and end in text
    assert text.split(start, 1)[1].split(end, 1)[0] == p.markdown(), (
        "docs/HEALTH.md's policy table is stale: paste `python -m exporter.health --markdown`")


def test_the_table_is_bounded_and_every_row_cites_its_source():
    assert p.ACTIONS == ("none", "restart_app", "reset_gpu", "reboot_node", "drain_and_reset",
                         "inspect_hardware", "contact_support")
    for rule in p.SIGNAL_RULES:
        assert rule.source and rule.action in p.ACTIONS and rule.state in p.STATES[1:]
    assert [x.code for x in p.XID_RULES] == sorted({x.code for x in p.XID_RULES})
    expected = {13: "restart_app", 31: "restart_app", 45: "restart_app", 48: "reset_gpu", 63: "none",
                64: "reset_gpu", 68: "restart_app", 69: "restart_app", 74: "reset_gpu", 79: "reboot_node",
                92: "none", 94: "restart_app", 95: "reset_gpu", 109: "reset_gpu", 119: "reset_gpu",
                120: "reset_gpu", 140: "reset_gpu", 154: "reset_gpu"}
    assert {c: p.XIDS[c].action for c in expected} == expected
    assert all(p.XIDS[c].clears == p.FIELD for c in range(144, 151))
    assert all(r.startswith("xid_") or r in p.RULES for r in p.REASONS)


# ---- properties ------------------------------------------------------------------------------

_counts = st.one_of(st.none(), st.integers(-3, 10**6), st.just(math.nan), st.floats(-1, 10))
_reads = st.builds(
    HealthSignals,
    row_remap=st.one_of(st.none(), st.builds(RowRemap, _counts, _counts, st.one_of(st.none(), st.booleans(),
                                                                                  st.integers(-1, 3)),
                                              st.one_of(st.none(), st.booleans()), _counts)),
    ecc=st.one_of(st.none(), st.builds(Ecc, _counts, _counts, sram_threshold_exceeded=st.one_of(st.none(),
                                                                                                st.booleans()))),
    pcie=st.one_of(st.none(), st.builds(Pcie, _counts, _counts, _counts, _counts, _counts)),
    nvlinks=st.lists(st.builds(NvLink, st.integers(0, 3), st.one_of(st.none(), st.booleans()), _counts, _counts,
                               _counts, _counts), max_size=4).map(tuple),
    recovery_action=st.one_of(st.none(), st.integers(-2, 9)),
    fabric=st.one_of(st.none(), st.builds(Fabric, st.one_of(st.none(), st.integers(-1, 5)),
                                          st.one_of(st.none(), st.booleans()), st.one_of(st.none(), st.booleans()))),
    xgmi_status=st.one_of(st.none(), st.integers(-1, 4)),
    gpu_lost=st.booleans(), reset_required=st.booleans(),
    boot_id=st.sampled_from([None, "a", "b"]), energy_mj=_counts,
)
_passes = st.lists(st.tuples(st.floats(0.5, 900), st.one_of(st.none(), _reads),
                             st.lists(st.sampled_from([13, 31, 43, 48, 63, 64, 79, 94, 95, 119, 145, 154, 999, -1]),
                                      max_size=3),
                             st.one_of(st.none(), st.floats(0, 1), st.just(math.nan)), st.booleans()),
                   min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(_passes)
def test_the_verdict_is_always_the_worst_of_its_reasons(passes):
    state, now = HealthState(), 0.0
    for seconds, read, xids, utilization, stuck in passes:
        now += seconds
        state, v = assess(state, now, read, xids, utilization, stuck)
        assert v.action == p.worst_action([r.action for r in v.reasons])
        assert (v.state == "healthy") == (not v.reasons) == (v.action == "none")
        assert list(v.reason_names) == sorted(set(v.reason_names))
        assert set(v.reason_names) <= set(p.REASONS)
        assert v.action in p.ACTIONS and v.state in p.STATES
