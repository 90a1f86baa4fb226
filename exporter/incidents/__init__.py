"""Incidents: a GPU that filled up or faulted, the workloads that caused it and those it hurt.

The parts that reach outside the agent live here, each in its own module:

- `exporter.incidents.kmsg` reads NVIDIA's Xid lines from the kernel log (``/dev/kmsg``,
  or a file in its record format), without ever blocking a pass;
- `exporter.incidents.events` posts Kubernetes Events on the pods involved, aggregated
  and rate-limited as the kubelet does, from a thread of its own.
"""
