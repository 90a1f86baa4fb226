"""Chargeback: GPU-hours, energy, money and waste per team, from Prometheus history.

``l9gpu report`` reads the agent's counters back from Prometheus over a period and sums
them per namespace, pod label, Slurm account or Slurm user (see docs/CHARGEBACK.md):

- `prices`  the prices file (per GPU model per hour, per kWh, overrides), validated, and
            the Prometheus recording rules that carry the same prices to Grafana;
- `periods` START/END as dates, timestamps or relative times (``30d``, ``now``);
- `prom`    the Prometheus HTTP API client (bearer token, basic auth, CA, client cert);
- `compute` exact counter increases per series (resets and series churn handled);
- `aggregate` the same rule evaluated by the server: per-series totals, per-group steps;
- `rules`   the chargeback recording rules and ``--source rules``;
- `carbon`  gCO2e per group: each step's energy times the grid's carbon intensity;
- `output`  CSV, JSON and a self-contained HTML page;
- `cli`     the ``l9gpu report`` and ``l9gpu prices`` subcommands.
"""

__all__: list[str] = []  # the public names live in the modules the docstring names
