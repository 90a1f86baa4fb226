"""/metrics bytes: content negotiation, gzip, rendered once per snapshot.

A scrape never touches hardware: it serves bytes rendered from the current snapshot.
Bytes are rendered once per (snapshot, encoding, gzip) and reused by every scrape of
that snapshot; they are re-rendered at most once per interval when the snapshot stops
changing, so ``l9gpu_snapshot_age_seconds`` keeps growing if the collector stalls.
After a pass, only the variants a scrape is expected for are rendered ahead
(`exporter.web.forecast.ScrapeForecast`).

With the DCGM schema every scraper that accepts the text format gets it, as from
dcgm-exporter (whose counters OpenMetrics cannot type counter); only a scraper that
accepts nothing but OpenMetrics gets OpenMetrics (docs/MIGRATING-FROM-DCGM.md).
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.core.model import Snapshot
from exporter.output.encode import Encoder, for_openmetrics
from exporter.web.forecast import ScrapeForecast


def text_first(accept: str) -> str:
    """The ``Accept`` header without its OpenMetrics entries, when it accepts anything else.

    Prometheus asks for OpenMetrics first and the text format after it (``text/plain``
    with a lower ``q``, or ``*/*``); `choose_encoder` then answers the text format. A
    header naming only OpenMetrics, or one whose other entries are all refused
    (``q=0``), is returned as it is.
    """
    others = []
    for entry in accept.split(","):
        media, *params = (part.strip() for part in entry.split(";"))
        if not media or media.lower() == "application/openmetrics-text":
            continue
        if media.lower() in ("text/plain", "text/*", "*/*") and not any(_refuses(p) for p in params):
            others.append(entry.strip())
    return ",".join(others) if others else accept


def _refuses(parameter: str) -> bool:
    """True for an Accept entry's ``q=0`` (that type is not acceptable)."""
    name, _, value = parameter.partition("=")
    if name.strip().lower() != "q":
        return False
    try:
        return float(value) == 0.0
    except ValueError:
        return False


@dataclass(frozen=True)
class _Rendered:
    seq: int
    rendered_at: float
    body: bytes
    zipped: bytes | None = None


class Exposition:
    """Renders the registry to bytes, cached per encoding, once per snapshot.

    After each pass the collector thread calls `warm`, which renders (and gzips) the
    variants a scrape is expected for before the next pass (`ScrapeForecast`) — a few
    families at a time so the event loop keeps answering in between. Scrapes get the
    newest bytes rendered, at most ``max_age`` old; a scrape renders by itself only when
    nothing recent enough is cached (a client's first scrapes, before its period is
    known, or a collector that stopped publishing, so that ``l9gpu_snapshot_age_seconds``
    keeps growing).

    Args:
        registry: the registry to render (the snapshot collector plus process metrics).
        get_snapshot: the current snapshot.
        max_age: seconds for which cached bytes may still be served.
        interval: seconds between collection passes.
        clock: monotonic clock, seconds.
        prefer_text: answer the text format to every client that accepts it, whatever it
            prefers (see `text_first`); OpenMetrics only to a client that accepts nothing
            else. For the DCGM schema: dcgm-exporter only ever answers text, in which its
            counters are typed counter, and OpenMetrics cannot type them so.
    """

    def __init__(self, registry: CollectorRegistry, get_snapshot: Callable[[], Snapshot | None],
                 max_age: float = 1.0, interval: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 prefer_text: bool = False):
        self.registry = registry
        self._prefer_text = prefer_text
        self._get_snapshot = get_snapshot
        self._max_age = max_age
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, _Rendered] = {}  # by content type
        self._encoders: dict[str, Encoder] = {}  # by content type: each keeps its label texts
        # variants scrapers asked for: (Accept header, gzip)
        self._wanted: dict[tuple[str, bool], None] = {}
        self.forecast = ScrapeForecast()

    def render(self, accept: str | None, want_gzip: bool, background: bool = False,
               client: str | None = None) -> tuple[bytes, str]:
        """Return (body, content type) for a request's Accept and Accept-Encoding.

        Args:
            accept: the request's Accept header.
            want_gzip: the request accepts gzip.
            background: called from the collector thread: render the current snapshot
                (unless already done), a few families at a time.
            client: who scrapes (the peer's address), to learn its scrape period.
        """
        library, content_type = choose_encoder(text_first(accept or "") if self._prefer_text else accept or "")
        snapshot = self._get_snapshot()
        seq = snapshot.seq if snapshot is not None else 0
        now = self._clock()
        variant = (accept or "", want_gzip)
        with self._lock:
            if not background:
                self._wanted[variant] = None
                if len(self._wanted) > 8:  # forget odd one-off clients
                    self._wanted = {variant: None}
            hit = self._cache.get(content_type)
            encoder = self._encoders.get(content_type)
            if encoder is None:
                encoder = self._encoders[content_type] = Encoder(library)
        if not background:
            self.forecast.observe((client or "",) + variant, now)
        if hit is None or now - hit.rendered_at > self._max_age or (background and hit.seq != seq):
            families: Iterable[Any] = self.registry.collect()
            if encoder.openmetrics:
                # dcgm-exporter's counters typed unknown; with dots escaping, units escaped
                families = for_openmetrics(families, encoder.escaping)
            # in the collector thread, a few families at a time so the event loop keeps answering
            body = encoder.encode(families, step=4 if background else 0)
            hit = _Rendered(seq, now, body)
        if want_gzip and hit.zipped is None:
            hit = replace(hit, zipped=gzip.compress(hit.body, compresslevel=5))
        with self._lock:
            current = self._cache.get(content_type)
            if current is None or (current.seq, current.rendered_at) <= (hit.seq, hit.rendered_at):
                self._cache[content_type] = hit
        return (hit.zipped if want_gzip and hit.zipped is not None else hit.body), content_type

    def warm(self, snapshot: Snapshot) -> None:
        """Render, for a new snapshot, the variants a scrape is due for before the next
        pass (collector thread); the others wait for their next expected scrape."""
        now = self._clock()
        with self._lock:
            wanted = list(self._wanted)
        # Until about when the next pass has run: a scrape due right at a pass boundary may
        # arrive while that pass runs, so the pass before renders for it (and only it).
        horizon = 1.05 * self._interval
        for accept, want_gzip in wanted:
            if self.forecast.due((accept, want_gzip), now, horizon):
                self.render(accept or None, want_gzip, background=True)
