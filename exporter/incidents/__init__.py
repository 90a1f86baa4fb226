"""Incidents: a GPU that filled up or faulted, the workloads that caused it and those it hurt.

The parts that reach outside the agent live here, each in its own module:

- `exporter.incidents.kmsg` reads NVIDIA's Xid lines from the kernel log (``/dev/kmsg``,
  or a file in its record format), without ever blocking a pass;
- `exporter.incidents.journal` reads the same lines from the kernel's entries in the
  host's systemd journal, without privilege;
- `exporter.incidents.events` posts Kubernetes Events on the pods involved, aggregated
  and rate-limited as the kubelet does, from a thread of its own.
"""

from __future__ import annotations

from typing import Any

from exporter.core.parsing import argtype, parse_positive_duration

__all__ = ["EVENTS_MODES", "add_arguments"]

EVENTS_MODES = ("on", "off")


def _kernel_log_setting(text: str) -> str:
    value = str(text).strip()
    if not value:
        raise ValueError("use auto, off, journal[:DIR] or the path of the kernel log (e.g. /dev/kmsg)")
    if value.lower() in ("auto", "off", "journal"):
        return value.lower()
    if value.lower().startswith("journal:"):
        directory = value.partition(":")[2]
        if not directory.startswith("/"):
            raise ValueError(f"journal:{directory}: name the journal directory by its absolute path "
                             "(e.g. journal:/var/log/journal)")
        return "journal:" + directory
    return value


def _history(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 100_000:
        raise ValueError(f"{value} is out of range (1 to 100000)")
    return value


def add_arguments(group: Any) -> None:
    """The flags of the incidents part of ``l9gpu serve`` (docs/INCIDENTS.md)."""
    group.add_argument("--kernel-log", default="off", type=argtype(_kernel_log_setting),
                       metavar="auto|journal[:DIR]|PATH|off",
                       help="read NVIDIA's Xid lines from the kernel log, to name the process that raised an "
                            "application Xid: auto (/dev/kmsg where it can be read, else the host's systemd journal, "
                            "else none), journal (the kernel's entries in /var/log/journal and /run/log/journal; "
                            "journal:DIR for another directory; no privilege needed, only the directories mounted "
                            "read-only and the systemd-python binding), a path (/dev/kmsg, which needs CAP_SYSLOG, or "
                            "a file in its record format), or off (default: off)")
    group.add_argument("--kubernetes-events", default="on", choices=EVENTS_MODES, type=str.lower,
                       help="post a Warning Event on the pods that caused or were hit by a GPU incident, through the "
                            "API server (needs create and patch on events; default: on, where the Kubernetes API "
                            "is in use)")
    group.add_argument("--peak-window", default="30s", type=argtype(parse_positive_duration), metavar="DURATION",
                       help="container_gpu_memory_peak_bytes and gpu_memory_peak_bytes are the highest memory seen "
                            "over this long: make it longer than the scrape interval (default: 30s)")
    group.add_argument("--incident-history", default=256, type=argtype(_history), metavar="N",
                       help="how many incidents the agent keeps in memory for the page and /api/v1/incidents "
                            "(default: 256; Kubernetes Events and Prometheus keep them longer)")
