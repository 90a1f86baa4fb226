"""Device backends: one module (or package) per vendor, each a `base.Backend`.

Vendor libraries are imported inside each backend's ``open()``, so a node without them
can still run the others (or the simulated backend for a demo). A node's backends are a
list (``--backend amd,gaudi`` on a mixed-vendor node): `open_backends`. What every backend
does is `base.Backend`; what only some do is an interface of `capabilities` they declare.
A backend that reads GPU health subclasses `schedule.HealthReads`: ``--health-interval`` is
declared and handed to it here, so that no backend repeats it.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Mapping, Sequence

from exporter.devices.base import SAMPLING_FLAGS, SOURCE_FLAGS, Backend, BackendUnavailable
from exporter.devices.capabilities import CallTiming, GpmStatus, ProcessShareReads, Timings
from exporter.devices.schedule import HealthReads, add_health_interval_argument, health_interval_from

log = logging.getLogger(__name__)

# Probe order for --backend auto: NVIDIA, then AMD, then Gaudi.
AUTO_ORDER = ("nvml", "amd", "gaudi")


def registry() -> dict[str, type[Backend]]:
    """Every backend by ``--backend`` name, in the order their flags are listed."""
    from exporter.devices import amd, gaudi, nvml, simulated

    return {"simulated": simulated.SimulatedBackend, "nvml": nvml.NvmlBackend, "amd": amd.AmdBackend,
            "gaudi": gaudi.GaudiBackend}


def known_backends() -> list[str]:
    """Names accepted by ``--backend`` (besides ``auto``)."""
    return sorted(registry())


def add_arguments(group: Any, place: str) -> None:
    """Every backend's flags that belong at ``place`` (`SOURCE_FLAGS`, `SAMPLING_FLAGS`);
    ``--health-interval``, which every backend that reads health shares, after the sampling ones."""
    backends = registry().values()
    for backend in backends:
        backend.add_arguments(group, place)
    if place == SAMPLING_FLAGS and any(issubclass(backend, HealthReads) for backend in backends):
        add_health_interval_argument(group)


def options_from(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each backend's constructor options from the parsed flags, by backend name: its own
    (`Backend.options_from`), and ``health_interval`` for one that reads health."""
    return {name: {**backend.options_from(args),
                   **({"health_interval": health_interval_from(args)} if issubclass(backend, HealthReads) else {})}
            for name, backend in registry().items()}


def call_prefixes(backends: Sequence[Backend] | None = None) -> tuple[str, ...]:
    """What the libraries of ``backends`` (default: of every backend) name their functions
    with, to name the call that opening or closing them is stuck in."""
    prefixes: list[str] = []
    for prefix in (p for b in (backends if backends is not None else registry().values()) for p in b.call_prefixes):
        if prefix not in prefixes:
            prefixes.append(prefix)
    return tuple(prefixes)


def open_backends(spec: str, options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Backend]:
    """Build and open the backends named by ``--backend``.

    Args:
        spec: "auto", one name, or a comma-separated list for mixed-vendor nodes.
        options: per backend name, the keyword arguments of its constructor
            (`options_from`); a backend not named gets none.

    Returns:
        The opened backends, in the order named (auto: the first that opens).

    Raises:
        BackendUnavailable: with a message fit for the user.
    """
    factories = registry()
    options = options or {}
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise BackendUnavailable("--backend is empty; use auto, simulated, or " + ", ".join(AUTO_ORDER))
    if names == ["auto"]:
        reasons = []
        for name in AUTO_ORDER:
            backend = factories[name](**options.get(name, {}))
            try:
                backend.open()
            except BackendUnavailable as exc:
                reasons.append(f"{name}: {exc}")
                continue
            log.info("backend auto: using %s", name)
            return [backend]
        raise BackendUnavailable(
            "no GPU backend found ("
            + "; ".join(reasons)
            + "). For a demo without GPUs, run with --backend simulated."
        )
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise BackendUnavailable(
            f"unknown backend {unknown[0]!r}; choose auto or one of: {', '.join(sorted(factories))}"
        )
    backends = [factories[n](**options.get(n, {})) for n in names]
    opened: list[Backend] = []
    try:
        for backend in backends:
            backend.open()
            opened.append(backend)
    except BaseException:
        close_backends(opened)  # the ones opened before the one that failed
        raise
    return backends


def close_backends(backends: Sequence[Backend]) -> None:
    """Close every backend; one that fails to close does not stop the others."""
    for backend in backends:
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - closing must not stop the others
            log.debug("closing backend %s failed", backend.name, exc_info=True)


def joined_name(backends: Sequence[Backend]) -> str:
    """The backends' names joined with commas (``nvml``, ``amd,gaudi``): the ``collector``
    label of their reads' success."""
    return ",".join(b.name for b in backends)


__all__ = [
    "AUTO_ORDER",
    "SAMPLING_FLAGS",
    "SOURCE_FLAGS",
    "Backend",
    "BackendUnavailable",
    "CallTiming",
    "GpmStatus",
    "HealthReads",
    "ProcessShareReads",
    "Timings",
    "add_arguments",
    "call_prefixes",
    "close_backends",
    "joined_name",
    "known_backends",
    "open_backends",
    "options_from",
    "registry",
]
