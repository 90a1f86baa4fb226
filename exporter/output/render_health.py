"""The health families of a snapshot (`catalogue.HEALTH` scope), for `exporter.output.render`.

Verdict families come from ``Snapshot.health`` (every device, up or down: a GPU that fell
off the bus has a verdict too). Signal families come from ``Snapshot.health_signals``, the
last health read of each physical GPU that is up (between reads the last one stands). A
value the read did not report is absent, never 0.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

from exporter.core.model import Snapshot
from exporter.health import HealthSignals, Verdict
from exporter.health.signals import as_count, as_seconds

Row = tuple[tuple[str, ...], float]


def _verdict_rows(name: str, verdict: Verdict, transitions: int) -> Iterator[Row]:
    if name == "gpu_health":
        yield from (((state,), float(value)) for state, value in verdict.state_values())
    elif name == "gpu_health_action":
        yield from (((action,), float(value)) for action, value in verdict.action_values())
    elif name == "gpu_health_reason":
        yield from (((reason,), 1.0) for reason in dict.fromkeys(verdict.reason_names))
    elif name == "gpu_health_transitions_total":
        yield (), float(transitions)


def _flag(value: object) -> float | None:
    return None if not isinstance(value, bool) else float(value)


def _count(value: object) -> float | None:
    count = as_count(value)  # a garbage answer: the policy reports it once; no series from it
    return None if count is None else float(count)


def _row_remap(s: HealthSignals, name: str) -> Iterator[Row]:
    rr = s.row_remap
    if rr is None:
        return
    if name == "gpu_row_remap_pending":
        value = _flag(rr.pending)
        if value is not None:
            yield (), value
    elif name == "gpu_row_remap_failure":
        value = _flag(rr.failure)
        if value is not None:
            yield (), value
    else:
        for kind, count in (("correctable", rr.correctable), ("uncorrectable", rr.uncorrectable)):
            number = _count(count)
            if number is not None:
                yield (kind,), number


_PCIE = {"gpu_pcie_link_generation": "generation", "gpu_pcie_link_generation_max": "generation_max",
         "gpu_pcie_link_width": "width", "gpu_pcie_link_width_max": "width_max", "gpu_pcie_replays_total": "replays"}


def _pcie(s: HealthSignals, name: str) -> Iterator[Row]:
    if s.pcie is None:
        return
    value = _count(getattr(s.pcie, _PCIE[name]))
    if value is not None:
        yield (), value


def _nvlink(s: HealthSignals, name: str) -> Iterator[Row]:
    for link in s.nvlinks:
        if name == "gpu_nvlink_up":
            value = _flag(link.up)
            if value is not None:
                yield (str(link.link),), value
            continue
        for kind, count in (("replay", link.replay), ("recovery", link.recovery),
                            ("crc_flit", link.crc_flit), ("crc_data", link.crc_data)):
            number = _count(count)
            if number is not None:
                yield (str(link.link), kind), number


def _violations(s: HealthSignals, name: str) -> Iterator[Row]:
    if s.violations is None:
        return
    for reason, seconds in s.violations.items():
        number = as_seconds(seconds)
        if number is not None:
            yield (reason,), number


_SIGNALS: dict[str, Callable[[HealthSignals, str], Iterator[Row]]] = {
    "gpu_row_remap_pending": _row_remap, "gpu_row_remap_failure": _row_remap, "gpu_remapped_rows_total": _row_remap,
    **dict.fromkeys(_PCIE, _pcie),
    "gpu_nvlink_up": _nvlink, "gpu_nvlink_errors_total": _nvlink,
    "gpu_violation_seconds_total": _violations,
}


def health_rows(name: str, snapshot: Snapshot, dev_labels: Mapping[str, tuple[str, ...]]
                ) -> Iterator[Row]:
    """(label values, value) of the health family ``name`` for every device of ``snapshot``."""
    signals_of = _SIGNALS.get(name)
    for device in snapshot.devices:
        labels = dev_labels[device.key]
        if name == "gpu_unhealthy_seconds_total":
            seconds = snapshot.device_unhealthy_seconds.get(device.key)
            if seconds is not None:
                yield labels, seconds
        elif signals_of is None:
            verdict = snapshot.health.get(device.key)
            if verdict is not None:
                transitions = snapshot.health_transitions.get(device.key, 0)
                for extra, value in _verdict_rows(name, verdict, transitions):
                    yield labels + extra, value
        elif device.key in snapshot.health_signals:
            for extra, value in signals_of(snapshot.health_signals[device.key], name):
                yield labels + extra, value
