"""The health families' extractors (`catalogue.HEALTH` scope), for the rows of `catalogue_health`.

Verdict families come from ``Snapshot.verdicts`` (every device, up or down: a GPU that fell
off the bus has a verdict too). Signal families come from ``Snapshot.health_signals``, the
last health read of each physical GPU that is up (between reads the last one stands). A
value the read did not report, or one the driver answered with garbage, is absent, never 0:
`count` and `seconds` apply the one rule of `exporter.health.signals`, which the policy
and the DCGM fields (read from the same rows) share.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from exporter.core.model import DeviceSample, Snapshot
from exporter.health import HealthSignals, Verdict
from exporter.health.signals import as_count, as_seconds
from exporter.output.extract import Labels, PerDevice, Row

# a raw value of the health read -> the sample, None for no series
Rule = Callable[[object], float | None]
# the health read -> (label values after the device's, raw value) of each series
Reading = Callable[[HealthSignals], Iterable[tuple[Labels, object]]]


def flag(value: object) -> float | None:
    """A yes/no the read reported, as 1 or 0."""
    return None if not isinstance(value, bool) else float(value)


def count(value: object) -> float | None:
    """A count the read reported; a garbage answer gives no series (the policy reports it once)."""
    number = as_count(value)
    return None if number is None else float(number)


def seconds(value: object) -> float | None:
    """A duration in seconds the read reported; garbage gives no series."""
    return as_seconds(value)


def signals(reading: Reading, rule: Rule) -> PerDevice:
    """A family of the last health read: each (label values, raw value) ``reading`` finds
    there, made a sample by ``rule``; nothing for a GPU without a health read."""

    def read(snapshot: Snapshot, device: DeviceSample) -> Iterator[Row]:
        found = snapshot.health_signals.get(device.key)
        if found is None:
            return
        for extra, raw in reading(found):
            value = rule(raw)
            if value is not None:
                yield extra, value

    return PerDevice(read)


def signal(reading: Callable[[HealthSignals], object], rule: Rule) -> PerDevice:
    """A family of one value of the last health read, without labels of its own."""
    return signals(lambda found: (((), reading(found)),), rule)


def verdict(values: Callable[[Verdict], Iterable[Row]]) -> PerDevice:
    """A family of each GPU's verdict: (label values, value) from ``values``."""

    def read(snapshot: Snapshot, device: DeviceSample) -> Iterable[Row]:
        found = snapshot.verdicts.get(device.key)
        return () if found is None else values(found)

    return PerDevice(read)


def transitions(snapshot: Snapshot, device: DeviceSample) -> Iterator[Row]:
    """How often a GPU's verdict changed state, for each GPU that has a verdict."""
    if device.key in snapshot.verdicts:
        yield (), float(snapshot.health_transitions.get(device.key, 0))
