"""The simulated node (``--backend simulated``, the demo): `backend` plays a scenario from
`scenarios/` (GPUs, pods, load, Xid incidents) as a vendor backend would report it, and
`health` its health signals."""

from exporter.devices.simulated.backend import Scenario, SimulatedBackend, load_scenario

__all__ = ["Scenario", "SimulatedBackend", "load_scenario"]
