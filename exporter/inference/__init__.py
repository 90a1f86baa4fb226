"""Inference economics: each serving engine's tokens joined with the GPU time its pod held.

`engines` reads the engine mapping (which series hold tokens, KV cache, preemptions);
`rules` writes the Prometheus recording rules and alerts that join them with l9gpu's
workload counters on ``namespace`` and ``pod``. ``l9gpu report --by model`` reads the
same token counters exactly (exporter/report/). See docs/INFERENCE.md.
"""

__all__: list[str] = []  # the public names live in the modules the docstring names
