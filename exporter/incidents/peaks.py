"""Peak memory between scrapes: the highest value seen over the last ``--peak-window``.

A pass runs every second or two; Prometheus scrapes every 15-30 s. A spike that filled a
GPU and the crash that followed fall between two scrapes, so ``gpu_memory_used_bytes``
never shows them. `PeakMemory` keeps, per GPU and per workload on it, the largest value of
the passes within the window (a monotonic queue per series: O(1) amortised per pass), and
``container_gpu_memory_peak_bytes`` / ``gpu_memory_peak_bytes`` serve it.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Hashable, Iterable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)


class _WindowMax:
    """The maximum of the values added over the last ``window`` seconds."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: deque[tuple[float, int]] = deque()  # (time, value), values decreasing

    def add(self, now: float, value: int) -> None:
        """Add a value (`expire` follows, once per pass for every series)."""
        queue = self._queue
        while queue and queue[-1][1] <= value:
            queue.pop()
        queue.append((now, value))

    def expire(self, horizon: float) -> None:
        """Forget the values added before ``horizon``."""
        queue = self._queue
        while queue and queue[0][0] < horizon:
            queue.popleft()

    @property
    def value(self) -> int | None:
        return self._queue[0][1] if self._queue else None


class PeakSeries(Generic[K]):
    """Window maxima of many series, each fed once per pass; a series not fed for a whole
    window (a workload that left the GPU) is forgotten."""

    def __init__(self, window_seconds: float) -> None:
        if not window_seconds > 0:
            raise ValueError("the peak window must be a positive number of seconds")
        self.window = window_seconds
        self._series: dict[K, _WindowMax] = {}

    def observe(self, now: float, values: Iterable[tuple[K, int]]) -> None:
        all_series = self._series
        for key, value in values:
            series = all_series.get(key)
            if series is None:
                series = all_series[key] = _WindowMax()
            series.add(now, value)
        horizon = now - self.window
        gone = []
        for key, series in all_series.items():
            series.expire(horizon)
            if not series._queue:
                gone.append(key)
        for key in gone:
            del all_series[key]

    def peaks(self) -> Mapping[K, int]:
        out: dict[K, int] = {}
        for key, series in self._series.items():
            value = series.value
            if value is not None:
                out[key] = value
        return out
