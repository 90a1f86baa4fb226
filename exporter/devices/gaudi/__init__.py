"""Intel Gaudi accelerators through hl-smi (``--backend gaudi``): `backend` runs and parses
hl-smi's CSV, `health` its health fields."""

from exporter.devices.gaudi.backend import VENDOR, GaudiBackend

__all__ = ["VENDOR", "GaudiBackend"]
