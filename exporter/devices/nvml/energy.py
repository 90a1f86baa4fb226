"""Energy on NVML: the GPU's energy counter, read seldom, with power integrated in between.

The energy counter (``nvmlDeviceGetTotalEnergyConsumption``) costs far more per call than
the power reading (docs/PERFORMANCE.md), so it is read every `ENERGY_COUNTER_PERIOD`
seconds; between reads the backend adds the integral of power to the last reading. The
value reported never goes backwards: when a reading comes in below the estimate, the
estimate is held until the counter catches up, so the error never accumulates. A counter
that drops (the driver reloaded) is passed through as the reset it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.devices.nvml.common import POWER_AVERAGING_SECONDS, NvmlState
from exporter.devices.nvml.libnvml import Nvml, scaled


@dataclass
class EnergyEstimate:
    """A GPU's energy counter between reads: the last reading plus integrated power.

    Attributes:
        reading: the counter's last reading, joules.
        reported: what the backend reports: never less than before, except when the
            counter itself drops (a driver reload).
        at: monotonic seconds of the last power reading.
        power: the last power reading, watts (None: unknown).
        integral: joules integrated from power since the last counter reading.
    """

    reading: float
    reported: float
    at: float
    power: float | None
    integral: float = 0.0

    def read(self, reading: float, now: float, power: float | None) -> None:
        """A fresh counter reading replaces the estimate (held while it is ahead)."""
        if reading < self.reading:
            self.reported = reading  # the counter restarted; derive sees the reset
        else:
            self.reported = max(self.reported, reading)
        self.reading, self.integral, self.at, self.power = reading, 0.0, now, power

    def integrate(self, now: float, power: float) -> None:
        dt = max(0.0, now - self.at)
        if dt <= POWER_AVERAGING_SECONDS or self.power is None:
            self.integral += power * dt
        else:
            # The reading covers the last second exactly; the gap before it, the mean
            # of the readings at both ends.
            gap = dt - POWER_AVERAGING_SECONDS
            self.integral += power * POWER_AVERAGING_SECONDS + (self.power + power) / 2.0 * gap
        self.at, self.power = now, power
        self.reported = max(self.reported, self.reading + self.integral)


class EnergyMixin(NvmlState):
    """The energy estimate of each GPU (part of `NvmlBackend`)."""

    _energy_period: float
    _energy: dict[int, EnergyEstimate]

    def _energy_joules(self, nvml: Nvml, index: int, handle: Any, now: float,
                       power_watts: float | None) -> float | None:
        """The device's energy counter in joules, read every ``energy_counter_period``.

        Between reads: the last reading plus the integral of power since (see the module
        doc). None where the device has no energy counter (derive then integrates power).
        """
        estimate = self._energy.get(index)
        due = self._energy_period <= 0 or self._due(index, "energy", now, self._energy_period)
        if estimate is None or power_watts is None or due:
            reading = scaled(self._opt(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle), 1e-3)
            if reading is None:
                self._energy.pop(index, None)
                return None
            if estimate is None:
                estimate = EnergyEstimate(reading, reading, now, power_watts)
                self._energy[index] = estimate
            else:
                estimate.read(reading, now, power_watts)
            return estimate.reported
        estimate.integrate(now, power_watts)
        return estimate.reported
