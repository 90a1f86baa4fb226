"""The kernel log ``--kernel-log`` names, opened: ``/dev/kmsg`` or a file (`kmsg.KernelLog`),
the systemd journal (`journal.JournalKernelLog`), the node's own (the simulated node's
scenario), or none.

Each source polls without blocking and hands out `kmsg.XidRecord`s; which one ``auto`` took is
logged once, at info, with why not the others.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from exporter.incidents import kmsg
from exporter.incidents.journal import JournalKernelLog
from exporter.incidents.kmsg import KernelLog, KernelLogUnavailable

log = logging.getLogger(__name__)


def open_kernel_log(spec: str, from_start: bool = False, node_log: Any = None) -> Any:
    """The kernel log ``--kernel-log`` names: ``auto``, ``off``, ``journal[:DIR]`` or a path.

    ``auto`` reads ``node_log`` where the node has one of its own (the simulated node's
    scenario: `exporter.incidents.simulated`), else tries ``/dev/kmsg``, then the host's
    journal (``/var/log/journal`` and ``/run/log/journal``), then runs without, and logs
    once at info which it uses (and why not the others: the Xids then come from NVML,
    without the process); ``off`` is None; ``journal`` reads the journal's default
    directories and ``journal:DIR`` the one named; a path is a device or a file.

    Args:
        spec: the ``--kernel-log`` setting.
        from_start: read the records already buffered (a file: from its start).
        node_log: the node's own kernel log (with a ``path`` that says what it is), or None.

    Raises:
        KernelLogUnavailable: the source named cannot be read (the message says why).
    """
    if spec == "off":
        return None
    if spec == "auto":
        return _auto(from_start, node_log)
    if spec == "journal" or spec.startswith("journal:"):
        return JournalKernelLog(spec.partition(":")[2] or None, from_start=from_start)
    return KernelLog(spec, from_start=from_start)


def _auto(from_start: bool, node_log: Any) -> Any:
    """``--kernel-log auto``: the first source that opens, said once at info."""
    if node_log is not None:
        log.info("--kernel-log auto: reading the kernel log from %s", node_log.path)
        return node_log
    reasons = []
    openers: tuple[tuple[str, Callable[[], Any]], ...] = (
        (kmsg.DEV_KMSG, lambda: KernelLog(kmsg.DEV_KMSG, from_start=from_start)),
        ("the journal", lambda: JournalKernelLog(None, from_start=from_start)))
    for name, opener in openers:
        try:
            source = opener()
        except KernelLogUnavailable as exc:
            reasons.append(str(exc))
            continue
        where = name if name == source.path else f"{name} ({source.path})"
        log.info("--kernel-log auto: reading the kernel log from %s", where)
        return source
    log.info("--kernel-log auto: %s; Xid events come from NVML only, without the process that raised "
             "them", "; ".join(reasons))
    return None


__all__ = ["open_kernel_log"]
