"""Device backends: one module per vendor behind `base.Backend`.

Vendor libraries are imported inside each backend's ``open()``, so a node without them
can still run the others (or the simulated backend for a demo).
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from exporter.devices.base import Backend, BackendUnavailable
from exporter.model import DeviceSample

log = logging.getLogger(__name__)

# Probe order for --backend auto: NVIDIA, then AMD, then Gaudi.
AUTO_ORDER = ("nvml", "amd", "gaudi")


def _factories() -> dict[str, Callable[..., Backend]]:
    from exporter.devices import simulated

    factories: dict[str, Callable[..., Backend]] = {"simulated": simulated.SimulatedBackend}
    try:
        from exporter.devices import nvml

        factories["nvml"] = nvml.NvmlBackend
    except ImportError:  # pragma: no cover - module is part of the package
        pass
    try:
        from exporter.devices import amd

        factories["amd"] = amd.AmdBackend
    except ImportError:
        pass
    try:
        from exporter.devices import gaudi

        factories["gaudi"] = gaudi.GaudiBackend
    except ImportError:
        pass
    return factories


def known_backends() -> list[str]:
    """Names accepted by ``--backend`` (besides ``auto``)."""
    return sorted(_factories())


class MultiBackend:
    """Several backends on one node (mixed vendors), sampled in turn."""

    def __init__(self, backends: Sequence[Backend]):
        self.backends = list(backends)
        self.name = ",".join(b.name for b in self.backends)

    def open(self) -> None:
        for backend in self.backends:
            backend.open()

    def sample(self, now: float) -> list[DeviceSample]:
        samples = []
        for backend in self.backends:
            samples.extend(backend.sample(now))
        return samples

    def close(self) -> None:
        for backend in self.backends:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - closing must not stop the others
                log.debug("closing backend %s failed", backend.name, exc_info=True)


def open_backend(spec: str, options: dict[str, object]) -> Backend:
    """Build and open the backend(s) named by ``--backend``.

    Args:
        spec: "auto", one name, or a comma-separated list for mixed-vendor nodes.
        options: keyword arguments offered to every backend constructor; each backend
            takes the ones it knows (e.g. ``scenario``, ``proc_root``, ``hl_smi``).

    Raises:
        BackendUnavailable: with a message fit for the user.
    """
    factories = _factories()
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise BackendUnavailable("--backend is empty; use auto, simulated, or " + ", ".join(AUTO_ORDER))
    if names == ["auto"]:
        reasons = []
        for name in AUTO_ORDER:
            if name not in factories:
                continue
            backend = _build(factories[name], options)
            try:
                backend.open()
            except BackendUnavailable as exc:
                reasons.append(f"{name}: {exc}")
                continue
            log.info("backend auto: using %s", name)
            return backend
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
    backends = [_build(factories[n], options) for n in names]
    chosen: Backend = backends[0] if len(backends) == 1 else MultiBackend(backends)
    chosen.open()
    return chosen


def _build(factory: Callable[..., Backend], options: dict[str, object]) -> Backend:
    import inspect

    params = inspect.signature(factory).parameters
    accepted = {k: v for k, v in options.items() if k in params and v is not None}
    return factory(**accepted)


__all__ = ["Backend", "BackendUnavailable", "MultiBackend", "known_backends", "open_backend"]
