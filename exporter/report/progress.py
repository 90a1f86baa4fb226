"""What `l9gpu report` shows while it works: on a terminal, the queries answered of those
asked so far, the phase and the time elapsed, drawn by tqdm (the ``report`` extra);
nothing when standard error is not a terminal, with ``--quiet``, or without tqdm.

`Progress` is the silent default every part takes; `progress_for` picks the one to use.
"""

from __future__ import annotations

from typing import Any, TextIO


class Progress:
    """Progress that shows nothing: the default of `Prometheus` and `fetch.fetch`."""

    def phase(self, name: str) -> None:
        """What the report is doing now (shown until the next phase)."""

    def asked(self) -> None:
        """One more query was asked of Prometheus."""

    def answered(self) -> None:
        """One query was answered (or failed)."""

    def refresh(self) -> None:
        """Redraw (the elapsed time moves on while a long query runs)."""

    def note(self, line: str, stream: TextIO) -> None:
        """Print a line for the user without tearing the progress line."""
        print(line, file=stream)

    def close(self) -> None:
        """Take the progress line away."""


class TerminalProgress(Progress):
    """A tqdm line on standard error: ``l9gpu report: reading counters, 40/146 queries [00:07]``."""

    def __init__(self, tqdm: Any, stream: TextIO) -> None:
        self._bar = tqdm(total=0, file=stream, leave=False, dynamic_ncols=True, unit="query",
                         desc="l9gpu report: starting", bar_format="{desc}, {n}/{total} queries [{elapsed}]",
                         mininterval=0.2)
        self._tqdm = tqdm

    def phase(self, name: str) -> None:
        self._bar.set_description_str(f"l9gpu report: {name}", refresh=True)

    def asked(self) -> None:
        self._bar.total += 1  # the total grows as the answers ask for more (samples around resets)

    def answered(self) -> None:
        self._bar.update(1)

    def refresh(self) -> None:
        self._bar.refresh()

    def note(self, line: str, stream: TextIO) -> None:
        self._tqdm.write(line, file=stream)

    def close(self) -> None:
        self._bar.close()


def progress_for(stream: TextIO, quiet: bool) -> Progress:
    """Progress on `stream` when it is a terminal and the user did not ask for quiet; tqdm
    comes with the ``report`` extra, and without it the report runs silently."""
    if quiet or not stream.isatty():
        return Progress()
    try:
        from tqdm import tqdm
    except ImportError:
        return Progress()
    return TerminalProgress(tqdm, stream)
