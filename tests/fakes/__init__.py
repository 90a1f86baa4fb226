"""Stand-ins for what a GPU node has and a test machine lacks, all in one place.

Each fake stands for one real API and reproduces its shapes, units and error codes (the
real function and field names, the real return codes and exception classes, the real
wire format), so the agent's own code talks to it as it talks to the real thing: nothing
in ``exporter`` knows it is a fake. A test changes the fake's world between two passes
and reads what the agent made of it where a user reads it.

Vendor libraries and tools:

- `pynvml_fake`: NVIDIA's ``pynvml`` module (nvidia-ml-py): ``NVMLError`` and its
  subclasses by code, the structs' field names, milliwatts, millijoules, MHz, KB/s;
  calls that hang (``block``) and calls that cost what they cost on an H200 (``H200_COSTS``).
- ``nvml_shim/pynvml.py``: ``import pynvml`` for an agent in another process: the fake,
  the node described by ``$FAKE_NVML_SPEC`` (put the folder first on ``PYTHONPATH``).
- `amdsmi_fake`: AMD's ``amdsmi`` package: its functions, enums and
  ``AmdSmiLibraryException`` codes, the units of each ROCm release it mirrors.
- ``hl-smi``: Habana's ``hl-smi`` executable (a script: tests pass its path as
  ``--hl-smi``): the CSV of the query the agent makes, what it prints chosen by environment.

The agent on the NVML fake, as a process:

- `nvml_cli`: ``python tests/fakes/nvml_cli.py PID,... -- ARGS``: ``l9gpu ARGS`` on one
  fake GPU whose processes are the given host PIDs.
- `nvml_node`: ``l9gpu serve`` on a one-GPU fake whose processes a test changes while it
  runs; `nvml_node.Node` is the test's side (real processes in pod cgroups, their pods in
  the local API server). conftest.py's ``fake_nvml_node`` fixture gives one.

Servers on loopback or on unix sockets:

- `kubernetes_apiserver`: the Kubernetes API server: the pod list and chunked watch,
  core v1 Events, Nodes and their status, with outages (stopped, stalled, garbled, 410 Gone)
  on demand; conftest.py's ``apiserver`` fixture gives one.
- `cri_runtime`: a container runtime's CRI socket (``runtime.v1.RuntimeService``).
- `kubelet_podresources`: the kubelet's pod-resources socket (``v1.PodResourcesLister``).
- `otlp_receivers`: an OpenTelemetry Collector's OTLP receivers, gRPC and HTTP.
- `inference_engines`: inference engines' /metrics (vLLM, SGLang, TGI, Triton, NIM) as
  each engine writes them, served with ``loopback_http``.

Real components are not faked: the helpers that start them live beside the tests in
tests/ (``agent.py`` the agent as a subprocess, ``promserver.py`` Prometheus,
``containerd_runtime.py`` containerd and runc, ``browser.py`` chromium,
``journal_helpers.py`` systemd-journal-remote, ``cgroup_helpers.py`` cgroups,
``loopback_http.py`` an aiohttp app on loopback, ``flood.py`` connections on real
sockets); docs/DEVELOPMENT.md says what the suite runs against.

Tests import the fakes as ``from fakes.pynvml_fake import FakeNvml`` (conftest.py puts
tests/ on ``sys.path``; benchmarks and the scripts above put it there themselves).
"""
