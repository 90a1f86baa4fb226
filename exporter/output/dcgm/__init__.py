"""DCGM-exporter compatibility (``--metric-schema dcgm``): `fields` is the DCGM field table
(the health families' fields taken from their catalogue rows) and the counters files,
`render` the renderer."""

__all__: list[str] = []
