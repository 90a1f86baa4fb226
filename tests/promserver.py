"""A real Prometheus server (Debian package `prometheus`) on loopback, for the tests.

The server and the rule evaluation over backfilled history live in the product
(`exporter.report.backfill`), which ``make demo-report`` uses the same way.
"""

from exporter.report.backfill import PrometheusServer, evaluate_rules

__all__ = ["PrometheusServer", "evaluate_rules"]
