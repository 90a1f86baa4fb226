"""Optional OTLP push of the agent's Prometheus registry (see docs/OTLP.md)."""
