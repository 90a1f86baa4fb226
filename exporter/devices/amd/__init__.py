"""AMD Instinct GPUs through amdsmi (``--backend amd``): `backend` reads the GPUs and their
processes, `health` the RAS, bad-page and XGMI signals."""

from exporter.devices.amd.backend import VENDOR, AmdBackend

__all__ = ["VENDOR", "AmdBackend"]
