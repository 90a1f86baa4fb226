"""The pass: one read of the node, made into one immutable `Snapshot`.

`collector` runs the pass (read every backend under its bulkhead, attribute each process,
derive, judge health, hand the result to the incident watch); `derive` turns readings into
per-workload rows and counters; `health_stage` turns each GPU's health signals into a verdict;
`xids` counts each device's new XIDs once, for the health stage and the incident engine alike.
"""

__all__: list[str] = []
