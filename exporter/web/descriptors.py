"""File descriptors: the open-file limit, and the connections it leaves room for.

Connections and attribution's pidfds and kept-open /proc files share one open-file
limit: the soft limit is raised to the hard one at start (`raise_open_file_limit`), and
the connection cap is lowered so that attribution keeps its descriptors
(`connection_budget`).
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass

# The logger's name is the one these lines have always been logged under.
log = logging.getLogger("exporter.connections")

#: Descriptors kept free beyond those counted at start and attribution's kept-open files:
#: sockets to the kubelet, the container runtime, the API server and an OTLP collector,
#: NVML's device nodes as GPUs come and go, a web config reload, log rotation.
SPARE_DESCRIPTORS = 64

#: The fewest connections the cap is lowered to, however low the open-file limit.
MIN_CONNECTIONS = 8


@dataclass(frozen=True)
class OpenFileLimit:
    """The soft open-file limit before and after `raise_open_file_limit`, and the hard one
    (``resource.RLIM_INFINITY`` where unlimited)."""

    before: int
    soft: int
    hard: int

    def describe(self) -> str:
        hard = "unlimited" if self.hard == resource.RLIM_INFINITY else str(self.hard)
        if self.soft > self.before:
            return f"open-file limit raised from {self.before} to {self.soft} (hard limit {hard})"
        return f"open-file limit {self.soft} (hard limit {hard})"


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as src:
            return int(src.read())
    except (OSError, ValueError):
        return 1 << 20


def raise_open_file_limit() -> OpenFileLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (or to ``fs.nr_open`` where the
    hard limit is unlimited), as Go does at start since 1.19 and Python does not.

    systemd starts services with a soft limit of 1024; every connection, pidfd and kept-open
    /proc file counts against it. A failure leaves the limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _nr_open() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
            return OpenFileLimit(soft, soft, hard)
        return OpenFileLimit(soft, target, hard)
    return OpenFileLimit(soft, soft, hard)


def descriptors_in_use() -> int:
    """File descriptors this process has open now."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir opened
    except OSError:
        return 0


def connection_budget(requested: int, soft_limit: int, in_use: int, reserved: int) -> int:
    """Connections at most, so that ``reserved`` descriptors (and `SPARE_DESCRIPTORS`)
    stay free for attribution under the soft open-file limit.

    Args:
        requested: ``--max-connections``.
        soft_limit: the soft ``RLIMIT_NOFILE`` (``resource.RLIM_INFINITY``: unlimited).
        in_use: descriptors open now (the listener, NVML, sockets, log files).
        reserved: descriptors attribution may still open (a pidfd or /proc file per GPU
            process; `exporter.attribution.procfs.max_kept_open`).
    """
    if soft_limit == resource.RLIM_INFINITY or soft_limit < 0:
        return requested
    available = soft_limit - in_use - reserved - SPARE_DESCRIPTORS
    return max(MIN_CONNECTIONS, min(requested, available))
