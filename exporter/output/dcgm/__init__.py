"""DCGM-exporter compatibility (``--metric-schema dcgm``): `fields` is the DCGM field table
and its mapping from the catalogue, `health` the health fields, `render` the renderer."""

__all__: list[str] = []
