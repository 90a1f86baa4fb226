"""The XIDs new in a pass: one baseline of every device's cumulative XID counts (pure).

A device reports its XIDs as counts since the agent started, by code
(``DeviceSample.xid_errors``). Once per pass the collector calls `xid_step`, which compares
each device's counts with those it reported at the last pass it was in, and publishes the
result on the snapshot (``Snapshot.new_xids``). The health stage
(`exporter.collect.health_stage`) and the incident engine (`exporter.incidents.engine`) both
read it, so a verdict and an incident are never told two different stories about the same
XIDs.

The rules of the baseline:

* a device's first pass has no entry: its counts become the baseline (what each reader does
  with a device it meets for the first time is its own rule);
* a code whose count grew by n has n events in the pass;
* a count lower than the baseline (the driver was reloaded, the GPU reset, the backend
  counted anew) is no event: the lower count is the new baseline, and events count from it;
* a device missing from a pass keeps its baseline until it is back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.core.model import DeviceSample, frozen_mapping


@dataclass(frozen=True)
class XidBaseline:
    """The XID counts each device reported at the last pass it was in (``XidBaseline()`` at start).

    Attributes:
        counts: per device key, its cumulative counts by XID code.
    """

    counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def xid_growth(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Per XID code, by how much its cumulative count grew from ``before`` to ``after``
    (codes that did not grow left out; in the order of ``after``)."""
    grown: dict[str, int] = {}
    for code, count in after.items():
        more = int(count) - int(before.get(code, 0))
        if more > 0:
            grown[code] = more
    return grown


def xid_step(baseline: XidBaseline, devices: Sequence[DeviceSample]
             ) -> tuple[XidBaseline, Mapping[str, Mapping[str, int]]]:
    """One pass of the XID baseline (see the module doc).

    Args:
        baseline: what the previous passes left.
        devices: this pass's samples (down ones and MIG instances included).

    Returns:
        The baseline for the next pass, and per key of a device seen in an earlier pass, the
        XID events new in this one by code (empty where none).
    """
    counts = dict(baseline.counts)
    new: dict[str, Mapping[str, int]] = {}
    for device in devices:
        key = device.key
        before = counts.get(key)
        if before is not None:
            new[key] = frozen_mapping(xid_growth(before, device.xid_errors))
        counts[key] = device.xid_errors
    return XidBaseline(counts), frozen_mapping(new)


__all__ = ["XidBaseline", "xid_growth", "xid_step"]
