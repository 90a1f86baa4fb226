"""l9gpu: GPU telemetry that says whose pod, container or Slurm job uses each GPU."""

__all__ = ["__version__"]

__version__ = "0.2.0"
