"""Intel Gaudi accelerators through ``hl-smi``, and their processes through /proc.

Why hl-smi and not pyhlml: pyhlml is a ctypes wrapper around libhlml.so that ships
with the same Habana driver packages as hl-smi, is not on PyPI as a maintained wheel and
has no per-process query either; hl-smi is present on every Gaudi node (and in Habana's
container images), has a stable ``-Q ... -f csv`` interface, and one call reads every
device. The cost is one short subprocess per collection pass, bounded by a timeout.

One pass runs::

    hl-smi -Q index,uuid,serial,name,bus_id,driver_version,utilization.aip,
              memory.used,memory.total,power.draw,temperature.aip -f csv,noheader,nounits

which prints one line per device, fields separated by ``", "`` like nvidia-smi, e.g.
``0, 01P0-HL2080A0-15-TNF0A8-03-07-02, AM43000131, HL-225, 0000:33:00.0, 1.17.0-e3a4b6f,
17, 2048, 98304, 215, 34``. Units: utilisation percent -> ratio, memory MiB -> bytes,
power W, temperature °C. ``N/A`` fields are omitted; malformed lines are skipped and
counted, and the other devices still export.

The ``serial`` is the device id the Habana device plugin advertises to the kubelet
(``habana.ai/gaudi`` device ids in pod-resources), so allocation joins on it.

Processes: hl-smi cannot list them without root in the host PID namespace and gives no
per-process memory, so the backend scans ``<proc_root>/<pid>/fd/*`` for links to
``/dev/accel/accel<N>`` (the habanalabs driver in the kernel's accel subsystem, 6.2+) or
``/dev/hl<N>`` (the older out-of-tree driver). ``N`` is the device minor, which is the
index hl-smi reports. The control nodes (``/dev/accel/accel_controlD<N>``,
``/dev/hl_controlD<N>``) are deliberately ignored: monitoring tools such as hl-smi open
those, workloads open the compute node. Each (pid, device) gives one process with unknown
memory and unknown SM share (None, not 0).
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from exporter.core.model import DeviceSample, ProcessSample
from exporter.core.parsing import argtype, parse_positive_duration
from exporter.devices.base import SOURCE_FLAGS, Backend, BackendUnavailable
from exporter.devices.gaudi.health import HEALTH_FIELDS, parse_health_csv
from exporter.devices.schedule import BOOT_ID_PATH, DEFAULT_HEALTH_INTERVAL, HealthReads
from exporter.health.signals import HealthSignals

log = logging.getLogger(__name__)

VENDOR = "gaudi"

QUERY_FIELDS: tuple[str, ...] = (
    "index", "uuid", "serial", "name", "bus_id", "driver_version", "utilization.aip",
    "memory.used", "memory.total", "power.draw", "temperature.aip",
)
# Values hl-smi prints when it cannot read a field.
_NOT_AVAILABLE = frozenset({"N/A", "[N/A]", "NA", "[NOT SUPPORTED]", "NOT SUPPORTED", ""})
# Units hl-smi appends when ``nounits`` is not honoured; tolerated and stripped.
_UNITS = {"utilization.aip": "%", "memory.used": "MiB", "memory.total": "MiB",
          "power.draw": "W", "temperature.aip": "C"}
# /dev/accel/accel<N> (accel subsystem) or /dev/hl<N> (older driver); not the control nodes.
_DEVICE_LINK = re.compile(r"^/dev/(?:accel/accel|hl)(\d+)$")


@dataclass(frozen=True)
class HlSmiRow:
    """One device line of hl-smi output, in base units (None where N/A)."""

    index: int
    uuid: str
    serial: str
    name: str
    bus_id: str
    driver_version: str
    utilization: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    temperature_celsius: float | None


class _Malformed(ValueError):
    pass


def _text(value: str) -> str:
    value = value.strip()
    return "" if value.upper() in _NOT_AVAILABLE else value


def _number(field: str, value: str) -> float | None:
    text = value.strip()
    if text.upper() in _NOT_AVAILABLE:
        return None
    unit = _UNITS.get(field)
    if unit and text.endswith(unit):
        text = text[: -len(unit)].strip()
    try:
        result = float(text)
    except ValueError:
        raise _Malformed(f"{field} is not a number: {value.strip()[:40]!r}") from None
    if not math.isfinite(result) or result < 0:
        raise _Malformed(f"{field} is out of range: {value.strip()[:40]!r}")
    return result


def _parse_row(fields: list[str]) -> HlSmiRow:
    if len(fields) != len(QUERY_FIELDS):
        raise _Malformed(f"expected {len(QUERY_FIELDS)} fields, got {len(fields)}")
    values = dict(zip(QUERY_FIELDS, fields))
    index_text = values["index"].strip()
    if not index_text.isdigit() or not index_text.isascii():
        raise _Malformed(f"index is not a device number: {index_text[:40]!r}")
    util = _number("utilization.aip", values["utilization.aip"])
    used = _number("memory.used", values["memory.used"])
    total = _number("memory.total", values["memory.total"])
    return HlSmiRow(
        index=int(index_text),
        uuid=_text(values["uuid"]),
        serial=_text(values["serial"]),
        name=_text(values["name"]),
        bus_id=_text(values["bus_id"]),
        driver_version=_text(values["driver_version"]),
        utilization=None if util is None else min(util / 100.0, 1.0),
        memory_used_bytes=None if used is None else int(used * 2**20),
        memory_total_bytes=None if total is None else int(total * 2**20),
        power_watts=_number("power.draw", values["power.draw"]),
        temperature_celsius=_number("temperature.aip", values["temperature.aip"]),
    )


def parse_hl_smi_csv(text: str) -> tuple[list[HlSmiRow], list[str]]:
    """Parse ``hl-smi -Q <QUERY_FIELDS> -f csv,noheader,nounits`` output.

    Pure and total: it never raises. Blank lines are ignored; a line with the wrong
    number of fields, a non-numeric value, or an index seen before is skipped and
    described in ``problems``. ``N/A`` fields become None.

    Returns:
        (rows in output order, problems as short human-readable strings).
    """
    rows: list[HlSmiRow] = []
    problems: list[str] = []
    seen: set[int] = set()
    try:
        lines = text.splitlines()
    except Exception:  # noqa: BLE001 - not a str; nothing usable
        return [], ["output is not text"]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            fields = next(csv.reader(io.StringIO(line), skipinitialspace=True), [])
            row = _parse_row(fields)
            if row.index in seen:
                raise _Malformed(f"device index {row.index} repeated")
        except (_Malformed, csv.Error) as exc:
            problems.append(f"line {number}: {exc}")
            continue
        seen.add(row.index)
        rows.append(row)
    return rows, problems


def format_hl_smi_row(row: HlSmiRow) -> str:
    """The line hl-smi prints for ``row`` (nounits); the inverse of the parser."""

    def num(value: float | None, scale: float = 1.0) -> str:
        return "N/A" if value is None else repr(value / scale)

    fields = [
        str(row.index), row.uuid or "N/A", row.serial or "N/A", row.name or "N/A",
        row.bus_id or "N/A", row.driver_version or "N/A",
        num(None if row.utilization is None else row.utilization * 100.0),
        num(row.memory_used_bytes, 2**20), num(row.memory_total_bytes, 2**20),
        num(row.power_watts), num(row.temperature_celsius),
    ]
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(fields)
    return out.getvalue()


def scan_accel_processes(proc_root: str) -> dict[int, set[int]]:
    """Map device minor -> PIDs holding ``/dev/accel/accel<N>`` (or ``/dev/hl<N>``) open.

    Processes that exit mid-scan or whose fds the agent may not read are skipped.
    """
    holders: dict[int, set[int]] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError as exc:
        log.debug("gaudi: cannot list %s: %s", proc_root, exc)
        return holders
    for entry in entries:
        if not entry.isdigit():
            continue
        fd_dir = os.path.join(proc_root, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            match = _DEVICE_LINK.match(target)
            if match:
                holders.setdefault(int(match.group(1)), set()).add(int(entry))
    return holders


class HlSmiError(RuntimeError):
    """hl-smi failed for the whole node (missing, hung, or exited with an error)."""


class GaudiBackend(HealthReads, Backend):
    """Reads Intel Gaudi devices with one ``hl-smi`` call per pass.

    Args:
        hl_smi: the hl-smi executable, a name looked up on PATH or a path.
        hl_smi_timeout: seconds to wait for hl-smi before killing it.
        proc_root: where the host's /proc is mounted (for the fd scan).
        health_interval, boot_id_path: its health reads' (`HealthReads`).
    """

    name = "gaudi"
    # Named in what a stuck pass reports: hl-smi that ignores its kill, a /proc scan that hangs.
    call_prefixes = ("_query", "scan_accel_processes")

    @classmethod
    def add_arguments(cls, group: Any, place: str) -> None:
        if place != SOURCE_FLAGS:
            return
        group.add_argument("--hl-smi", default="hl-smi", metavar="PATH", help="hl-smi executable for --backend gaudi")
        group.add_argument("--hl-smi-timeout", default="5s", type=argtype(parse_positive_duration),
                           metavar="DURATION", help="kill hl-smi after this long (default: 5s)")

    @classmethod
    def options_from(cls, args: Any) -> dict[str, Any]:
        """``--hl-smi``, ``--hl-smi-timeout`` and attribution's ``--proc-root`` (where the
        host's /proc is, for the scan of who holds a device)."""
        options = {"hl_smi": args.hl_smi, "hl_smi_timeout": args.hl_smi_timeout, "proc_root": args.proc_root}
        return {k: v for k, v in options.items() if v is not None}

    def __init__(self, hl_smi: str = "hl-smi", hl_smi_timeout: float = 5.0, proc_root: str = "/proc",
                 health_interval: float | None = DEFAULT_HEALTH_INTERVAL, boot_id_path: str = BOOT_ID_PATH):
        # Health reads: a second, slow hl-smi query (`exporter.devices.gaudi.health`).
        super().__init__(health_interval, boot_id_path)
        self.hl_smi = hl_smi
        self.hl_smi_timeout = float(hl_smi_timeout)
        # The collector's deadline on a pass of this backend: hl-smi has its own timeout
        # (it is killed then); past this, even the kill or the /proc scan hangs.
        self.read_timeout = self.hl_smi_timeout + 5.0
        self.proc_root = proc_root
        self._path: str | None = None
        self._errors: dict[str, int] = {}
        # index -> the last good sample, so a device that drops out reads as down.
        self._known: dict[int, DeviceSample] = {}
        self._warned: set[str] = set()

    # ---- lifecycle ------------------------------------------------------------------
    def open(self) -> None:
        """Find hl-smi and check that it lists at least one device.

        Raises:
            BackendUnavailable: hl-smi is missing, fails, hangs, or lists no devices.
        """
        path = self._resolve()
        if path is None:
            self._count("not_found")
            raise BackendUnavailable(
                f"hl-smi not found at {self.hl_smi!r}; install the Habana driver tools or pass "
                "--hl-smi with its path (in a container, mount it from the host)"
            )
        self._path = path
        try:
            rows = self._query()
        except HlSmiError as exc:
            raise BackendUnavailable(str(exc)) from exc
        if not rows:
            raise BackendUnavailable(f"{path} lists no Gaudi devices")
        # Remember every device now, so one that drops out later reads as down.
        self._known = {row.index: self._device(row, []) for row in rows}
        self.open_health()
        log.info("gaudi: %d device(s) found with %s", len(rows), path)

    def close(self) -> None:
        """Nothing to release: hl-smi runs per pass."""

    def errors(self) -> Mapping[str, int]:
        """Cumulative counts by reason: timeout, malformed_line, not_found, exit_status."""
        return dict(self._errors)

    # ---- sampling -------------------------------------------------------------------
    def sample(self, now: float) -> list[DeviceSample]:
        """Run hl-smi once and scan /proc once.

        Raises:
            HlSmiError: hl-smi is missing, timed out or failed; the collector marks the
                backend failed for this pass and tries again on the next.
        """
        rows = self._query()
        holders = scan_accel_processes(self.proc_root)
        health = self._read_health([row.index for row in rows], now)
        samples: list[DeviceSample] = []
        present = set()
        for row in rows:
            present.add(row.index)
            sample = self._device(row, sorted(holders.get(row.index, ())))
            if row.index in health:
                sample = replace(sample, health_signals=health[row.index])
            self._known[row.index] = sample
            samples.append(sample)
        for index in sorted(set(self._known) - present):
            last = self._known[index]
            samples.append(last.down("missing from hl-smi output"))
        samples.sort(key=lambda s: s.index)
        return samples

    @staticmethod
    def _device(row: HlSmiRow, pids: list[int]) -> DeviceSample:
        return DeviceSample(
            index=row.index,
            uuid=row.uuid,
            model=row.name,
            vendor=VENDOR,
            driver_version=row.driver_version,
            pci_bus_id=row.bus_id,
            serial=row.serial,
            utilization=row.utilization,
            memory_used_bytes=row.memory_used_bytes,
            memory_total_bytes=row.memory_total_bytes,
            power_watts=row.power_watts,
            temperature_celsius=row.temperature_celsius,
            processes=tuple(ProcessSample(pid=pid) for pid in pids),
        )

    # ---- hl-smi ---------------------------------------------------------------------
    def _resolve(self) -> str | None:
        if os.sep in self.hl_smi:
            return self.hl_smi if os.path.isfile(self.hl_smi) and os.access(self.hl_smi, os.X_OK) else None
        return shutil.which(self.hl_smi)

    def _read_health(self, indexes: list[int], now: float) -> dict[int, HealthSignals]:
        """The health of the devices due this pass (one hl-smi call for all of them); {} when
        none is due or the health query fails (counted as ``health_query``, logged once)."""
        due = [index for index in indexes if self.health_due(index, len(indexes), now)]
        if not due:
            return {}
        try:
            text = self._run(HEALTH_FIELDS, health=True)
        except HlSmiError as exc:
            self._count("health_query")
            level = logging.DEBUG if "health" in self._warned else logging.WARNING
            self._warned.add("health")
            log.log(level, "gaudi: the hl-smi health query failed (%s); metrics carry on without it", exc)
            return {}
        ecc = parse_health_csv(text)
        return {index: HealthSignals(ecc=ecc.get(index), boot_id=self._boot_id) for index in due}

    def _query(self) -> list[HlSmiRow]:
        rows, problems = parse_hl_smi_csv(self._run(QUERY_FIELDS))
        if problems:
            self._errors["malformed_line"] = self._errors.get("malformed_line", 0) + len(problems)
            for problem in problems:
                level = logging.DEBUG if problem in self._warned else logging.WARNING
                self._warned.add(problem)
                log.log(level, "gaudi: skipped a malformed hl-smi line (%s)", problem)
        return rows

    def _run(self, fields: tuple[str, ...], health: bool = False) -> str:
        """hl-smi's answer to ``-Q <fields>``; a health query's failures are its caller's to count."""
        path = self._path or self._resolve() or self.hl_smi
        argv = [path, "-Q", ",".join(fields), "-f", "csv,noheader,nounits"]
        count = (lambda reason: None) if health else self._count
        warn, error = (log.debug, log.debug) if health else (log.warning, log.error)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # so a timeout kills hl-smi and anything it started
            )
        except (FileNotFoundError, PermissionError) as exc:
            count("not_found")
            error("gaudi: cannot run hl-smi at %r: %s", path, exc)
            raise HlSmiError(f"hl-smi not found at {path!r}: {exc}") from exc
        try:
            out, err = proc.communicate(timeout=self.hl_smi_timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            count("timeout")
            warn("gaudi: %s did not answer within %gs; killed it", path, self.hl_smi_timeout)
            raise HlSmiError(f"hl-smi did not answer within {self.hl_smi_timeout:g}s") from None
        if proc.returncode != 0:
            count("exit_status")
            detail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            warn("gaudi: %s exited with status %d: %s", path, proc.returncode, detail[0][:200])
            raise HlSmiError(f"hl-smi exited with status {proc.returncode}: {detail[0][:200]}")
        return out.decode("utf-8", "replace")

    def _count(self, reason: str) -> None:
        self._errors[reason] = self._errors.get(reason, 0) + 1


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


__all__ = [
    "QUERY_FIELDS",
    "VENDOR",
    "GaudiBackend",
    "HlSmiError",
    "HlSmiRow",
    "parse_hl_smi_csv",
    "scan_accel_processes",
]
