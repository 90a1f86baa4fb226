"""What leaves the agent: the metric table and everything that reads it.

`catalogue` is the one table of metric families (with `catalogue_health` its health rows),
each row (`spec.MetricSpec`) carrying what renders it (`extract`, `render_health`);
`render` turns a `Snapshot` into those families; `encode` writes the exposition formats;
`counts` holds self-metrics counted by label; `snapshot_json` is the JSON of
``/api/v1/snapshot`` and ``l9gpu snapshot``; `dcgm` serves the same under DCGM exporter
names; `metrics_doc` (with `vendor_notes`) writes docs/METRICS.md from the table.
"""

__all__: list[str] = []
