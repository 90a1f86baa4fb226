"""Gaudi health reads: a second, slow-schedule hl-smi query (every ``--health-interval``).

hl-smi documents these ``-Q`` fields (docs.habana.ai, System Management Interface Tool)::

    hl-smi -Q index,ecc.mode.current,ecc.errors.corrected.volatile.total,
              ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,
              ecc.errors.uncorrected.aggregate.total -f csv,noheader,nounits

-> `Ecc` ``enabled`` / volatile and aggregate corrected / uncorrected, per device. The query
is apart from the pass's own so that an hl-smi that does not know one of these fields fails
only the health read (logged once); the pass's metrics carry on. Volatile counts restart when
the driver loads; aggregate ones live on the device.

hl-smi gives no PCIe link state or replay counter, no interconnect (RoCE port) error
counters, no recovery action and no fabric state in ``-Q``: those fields stay None.
"N/A" becomes None; a number is passed on as hl-smi prints it (`exporter.health.checks`
rejects garbage); a line without a device index is skipped.
"""

from __future__ import annotations

import csv
import io

from exporter.health.signals import Ecc

HEALTH_FIELDS: tuple[str, ...] = (
    "index", "ecc.mode.current", "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
)
_NOT_AVAILABLE = frozenset({"N/A", "[N/A]", "NA", "[NOT SUPPORTED]", "NOT SUPPORTED", ""})
_ENABLED = frozenset({"ENABLED", "ENABLE", "ON", "1", "TRUE"})
_DISABLED = frozenset({"DISABLED", "DISABLE", "OFF", "0", "FALSE"})


def _count(text: str) -> int | None:
    text = text.strip()
    if text.upper() in _NOT_AVAILABLE:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return None
        return int(value) if value == value and abs(value) != float("inf") else None


def _mode(text: str) -> bool | None:
    word = text.strip().upper()
    if word in _ENABLED:
        return True
    if word in _DISABLED:
        return False
    return None


def parse_health_csv(text: str) -> dict[int, Ecc]:
    """``hl-smi -Q <HEALTH_FIELDS> -f csv,noheader,nounits`` -> device index -> `Ecc`.

    Total: it never raises; a line with the wrong number of fields or no device index is
    skipped, and the first line of an index seen twice wins.
    """
    out: dict[int, Ecc] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            fields = next(csv.reader(io.StringIO(line), skipinitialspace=True), [])
        except csv.Error:
            continue
        if len(fields) != len(HEALTH_FIELDS):
            continue
        index = fields[0].strip()
        if not index.isdigit() or not index.isascii() or int(index) in out:
            continue
        out[int(index)] = Ecc(enabled=_mode(fields[1]), volatile_corrected=_count(fields[2]),
                              volatile_uncorrected=_count(fields[3]), aggregate_corrected=_count(fields[4]),
                              aggregate_uncorrected=_count(fields[5]))
    return out


__all__ = ["HEALTH_FIELDS", "parse_health_csv"]
