"""``import pynvml`` for an agent under test in its own process: the tests' NVML fake.

Put this directory (and tests/) first on the agent's PYTHONPATH and describe the node in
``$FAKE_NVML_SPEC`` (JSON)::

    {"gpus": [{"utilization_gpu": 10}, ...],            # FakeGpu fields, one object per GPU
     "hang": [{"call": "nvmlDeviceGetPowerUsage", "gpu": 1, "while_exists": "/tmp/x"}]}

``hang`` entries become `FakeNvml.block` calls: the call hangs while the file exists, so
the test (another process) releases it by removing the file. The module then *is* the
fake (``sys.modules`` swap), as ``import pynvml`` gives the binding's module.
"""

from __future__ import annotations

import json
import os
import sys

from fakes import pynvml_fake

_spec = json.loads(os.environ.get("FAKE_NVML_SPEC", "{}"))
_fake = pynvml_fake.FakeNvml([pynvml_fake.FakeGpu(**gpu) for gpu in _spec.get("gpus", [{}])])
_fake.record_calls = False  # a long-running agent: keep no call log
for _hang in _spec.get("hang", []):
    _fake.block(_hang.get("call"), _hang.get("gpu"), _hang.get("seconds"), _hang.get("while_exists"))
sys.modules[__name__] = _fake
