"""Optional OTLP push of the agent's Prometheus registry (see docs/OTLP.md)."""

__all__: list[str] = []  # the public names live in the modules the docstring names
