"""NVIDIA GPUs through NVML (``--backend nvml``), via the ``pynvml`` binding (nvidia-ml-py).

The package, as nvitop's ``api``:

* `libnvml`: the call wrapper (`libnvml.Nvml`): every NVML call, "not available" folded
  into the `NA` sentinel, versioned fallbacks, the error codes, the units;
* `backend`: `NvmlBackend`, its lifecycle and its pass (one part per GPU);
* `common`: the state the parts share, the schedule of slow re-reads, failures;
* `processes`: process lists and per-process utilisation (the SM shares);
* `mig`: MIG mode and MIG instances;
* `events`: XID events;
* `energy`: the energy counter, read seldom, power integrated in between;
* `gpm`: GPM (SM, tensor-core, DRAM, FP-pipe, PCIe and NVLink activity on Hopper and
  newer), per GPU, or per MIG instance in MIG mode (the parent then has none).

`NvmlBackend.enable_timings` makes every call record its wall and CPU time, which
``l9gpu snapshot --timings`` prints.
"""

from __future__ import annotations

from exporter.devices.nvml.backend import NvmlBackend, parse_gpm_interval
from exporter.devices.nvml.common import ECC_PERIOD, ENERGY_COUNTER_PERIOD, GRAPHICS_PERIOD, PCIE_PERIOD, SLOW_PERIOD
from exporter.devices.nvml.libnvml import NA, THROTTLE_REASONS, decode_throttle_reasons

__all__ = ["ECC_PERIOD", "ENERGY_COUNTER_PERIOD", "GRAPHICS_PERIOD", "NA", "PCIE_PERIOD", "SLOW_PERIOD",
           "THROTTLE_REASONS", "NvmlBackend", "decode_throttle_reasons", "parse_gpm_interval"]
