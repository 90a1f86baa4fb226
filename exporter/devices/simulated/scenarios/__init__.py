"""The simulated node's built-in scenarios (YAML files read by `exporter.devices.simulated.backend`)."""

__all__: list[str] = []
