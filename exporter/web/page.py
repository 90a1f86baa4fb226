"""The agent's own page (``/``) and its JSON (``/api/v1/snapshot``).

``/`` shows what ``l9gpu snapshot`` prints, for an on-call engineer with a browser and a
``kubectl port-forward``: every GPU (model, utilisation, memory bar, power, temperature,
up or down) and every workload on it (pod or Slurm job, memory, SM share, idle time,
allocated or not), with zombies (memory held at 0% SM, three passes in a row) and GPUs
allocated but unused called out at the top. One self-contained HTML document (the template ``page.html``:
inline CSS and a small script, nothing fetched from elsewhere) that re-fetches itself
every interval and swaps its ``<main>``; without JavaScript it reloads instead.

Both are rendered from `snapshot_json.snapshot_document`, lazily: only when someone asks,
on the event loop, at most once per snapshot (cached by its ``seq``), never by the
collector thread and never together with /metrics, whose bytes have their own cache.
While nobody opens the page it costs nothing. Responses carry an ETag, so a browser
polling a snapshot it already has gets a 304.
"""

from __future__ import annotations

import gzip
import html
import os
import string
import time
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, Callable, Iterable, Mapping, Sequence

from aiohttp import web

from exporter import __version__
from exporter.core.model import Snapshot
from exporter.output.snapshot_json import document_json, duration, snapshot_document

PAGE_PATH = "/"
API_PATH = "/api/v1/snapshot"

_TEMPLATE = string.Template(resources.files("exporter.web").joinpath("page.html").read_text(encoding="utf-8"))
_GZIP_MIN = 1024  # smaller bodies are not worth compressing
_GIB = 2**30


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _bytes(value: float | None) -> str:
    """Bytes as people read GPU memory: GiB with one decimal, MiB below 1 GiB."""
    if value is None:
        return "n/a"
    if not value:
        return "0 GiB"
    if abs(value) < _GIB:
        return f"{value / 2**20:.0f} MiB"
    return f"{value / _GIB:.1f} GiB"


def _percent(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f}%"


def _bar(ratio: float | None, high: float = 0.9) -> str:
    if ratio is None:
        return '<div class="bar"></div>'
    width = min(100.0, max(0.0, ratio * 100))
    cls = "bar hi" if ratio >= high else "bar"
    return f'<div class="{cls}"><i style="width:{width:.1f}%"></i></div>'


def _gpu_name(gpu: Mapping[str, Any]) -> str:
    name = f"GPU {gpu.get('index', '?')}"
    return f"{name} MIG {gpu['gpu_instance']}" if gpu.get("gpu_instance") else name


def _who(w: Mapping[str, Any]) -> str:
    """The workload's name, namespace muted and pod emphasised (searchable as one string),
    with the training job and rank it is where it is one."""
    if w.get("kind") == "slurm":
        text = f"Slurm job <b>{_e(w.get('slurm_job_id', ''))}</b>"
        if w.get("slurm_step"):
            text += f" step {_e(w['slurm_step'])}"
        if w.get("training_rank"):
            text += f' <span class="job">rank <b>{_e(w["training_rank"])}</b></span>'
        if w.get("slurm_user"):
            text += f" ({_e(w['slurm_user'])})"
        return text
    if w.get("pod"):
        parts = f'<span class="ns">{_e(w.get("namespace", ""))}/</span><span class="pod">{_e(w["pod"])}</span>'
        parts += f'<span class="ns">/</span>{_e(w["container"])}' if w.get("container") else ""
        if w.get("training_job"):
            rank = f', rank <b>{_e(w["training_rank"])}</b>' if w.get("training_rank") else ""
            parts += f' <span class="job">(job <b>{_e(w["training_job"])}</b>{rank})</span>'
        return parts
    return _e(w.get("owner") or w.get("kind") or "unknown")


def _details(w: Mapping[str, Any], comms: Mapping[int, str]) -> str:
    bits = []
    pids = w.get("pids") or []
    if pids:
        bits.append(", ".join(f"pid {p}" + (f" {comms[p]}" if comms.get(p) else "") for p in pids[:4])
                    + (f" +{len(pids) - 4}" if len(pids) > 4 else ""))
    if w.get("owner_kind") and w.get("owner_name"):
        bits.append(f"{w['owner_kind']} {w['owner_name']}")
    bits += [f"{k}={v}" for k, v in (w.get("pod_labels") or {}).items() if v]
    return f'<div class="sub">{_e(" · ".join(bits))}</div>' if bits else ""


def _allocated(value: Any) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return '<span title="unknown: pod-resources off, or not a pod">n/a</span>'


def _idle(w: Mapping[str, Any]) -> str:
    if w.get("idle_seconds") is None:
        return "n/a"
    if w.get("sm_utilization_ratio") == 0.0:
        return duration(w["idle_seconds"])
    return "&ndash;"


def _is_zombie(w: Mapping[str, Any], interval: float) -> bool:
    """At 0% SM with memory held for three passes in a row, not a single pass between kernels.

    Per-process SM shares are point samples (NVML gives the latest sample per process), so
    one pass at 0% between kernels says little. The document's ``zombie`` is that single
    pass; ``idle_seconds`` says how long it has lasted (two intervals: three passes).
    """
    return bool(w.get("zombie")) and (w.get("idle_seconds") or 0.0) >= 1.5 * interval


def _workload_row(w: Mapping[str, Any], comms: Mapping[int, str], interval: float) -> str:
    flags = ""
    cls = ""
    if _is_zombie(w, interval):
        flags += '<span class="flag">zombie</span>'
        cls = ' class="zombie" data-flag="zombie"'
    if w.get("allocated_unused"):
        flags += '<span class="flag warn">allocated, unused</span>'
        cls = ' class="unused" data-flag="allocated-unused"'
    if w.get("allocated") is False:
        flags += '<span class="flag warn" title="running on a GPU the kubelet did not allocate to it">' \
                 'not allocated</span>'
    return (f'<tr{cls}><td class="who">{_who(w)}{flags}{_details(w, comms)}</td>'
            f'<td class="n" data-label="mem">{_bytes(w.get("memory_used_bytes"))}</td>'
            f'<td class="n" data-label="SM">{_percent(w.get("sm_utilization_ratio"))}</td>'
            f'<td class="n" data-label="idle">{_idle(w)}</td>'
            f'<td class="n" data-label="allocated">{_allocated(w.get("allocated"))}</td></tr>')


def _gpm_facts(gpm: Mapping[str, Any]) -> list[str]:
    shown = (("sm_active", "SM active"), ("tensor_active", "tensor"), ("dram_active", "DRAM"))
    return [f"{label} <b>{_percent(gpm[key])}</b>" for key, label in shown if isinstance(gpm.get(key), (int, float))]


_HEALTH_ORDER = {"unhealthy": 0, "degraded": 1, "healthy": 2}


def health_rank(gpu: Mapping[str, Any]) -> int:
    """Where a GPU's card goes: unhealthy first, then degraded, then healthy (or unknown)."""
    health = gpu.get("health") or {}
    return _HEALTH_ORDER.get(str(health.get("state", "")), 2)


def _health_badge(gpu: Mapping[str, Any]) -> tuple[str, str]:
    """The card's health badge (state and action) and the line of its reasons, "" where healthy."""
    health = gpu.get("health")
    if not isinstance(health, Mapping):
        return "", ""
    state, action = str(health.get("state", "")), str(health.get("action", "none"))
    text = state if action == "none" else f"{state} · {action.replace('_', ' ')}"
    badge = f'<span class="health {_e(state)}" data-action="{_e(action)}">{_e(text)}</span>'
    reasons = health.get("reasons") or ()
    why = "".join(f'<li data-reason="{_e(r.get("reason", ""))}"><b>{_e(r.get("reason", ""))}</b>: '
                  f'{_e(r.get("text", ""))} — {_e(str(r.get("action", "")).replace("_", " "))}</li>'
                  for r in reasons)
    return badge, (f'<ul class="health-why">{why}</ul>' if why else "")


def _gpu_card(gpu: Mapping[str, Any], interval: float) -> str:
    name = _gpu_name(gpu)
    badge, why = _health_badge(gpu)
    head = (f'<h2>{_e(name)} <span class="model">{_e(gpu.get("model", ""))}</span>{badge}'
            f'<span class="state">{"up" if gpu.get("up", True) else "down"}</span></h2>{why}')
    anchor = f'gpu-{_e(gpu.get("index", ""))}' + (f'-{_e(gpu["gpu_instance"])}' if gpu.get("gpu_instance") else "")
    if not gpu.get("up", True):
        return (f'<section class="gpu down" id="{anchor}" data-uuid="{_e(gpu.get("uuid", ""))}">{head}'
                f'<p class="error">{_e(gpu.get("error") or "not readable")}</p></section>')
    used, total = gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes")
    mem_ratio = used / total if used is not None and total else None
    mem_text = f"{_bytes(used)} / {_bytes(total)}" if total else _bytes(used)
    stats = (f'<div class="stats"><span class="k">util</span>{_bar(gpu.get("utilization_ratio"), 1.1)}'
             f'<span class="v">{_percent(gpu.get("utilization_ratio"))}</span>'
             f'<span class="k">memory</span>{_bar(mem_ratio)}<span class="v">{mem_text}</span></div>')
    facts = []
    power, limit = gpu.get("power_watts"), gpu.get("power_limit_watts")
    if power is not None:
        facts.append(f"power <b>{power:.0f}</b>" + (f" / {limit:.0f}" if limit else "") + " W")
    if gpu.get("temperature_celsius") is not None:
        facts.append(f"temp <b>{gpu['temperature_celsius']:.0f} °C</b>")
    facts += _gpm_facts(gpu.get("gpm") or {})
    comms = {p.get("pid"): p.get("comm", "") for p in gpu.get("processes") or ()}
    workloads = sorted(gpu.get("workloads") or (), key=lambda w: -(w.get("memory_used_bytes") or 0))
    rows = [_workload_row(w, comms, interval) for w in workloads]
    rest = gpu.get("unattributed") or {}
    if rest.get("processes"):
        others = [p for p in gpu.get("processes") or () if p.get("kind") not in ("kubernetes", "slurm")]
        sub = ", ".join(f"pid {p.get('pid')} {p.get('comm', '')} ({p.get('owner', p.get('kind', ''))})"
                        for p in others[:4])
        rows.append(f'<tr class="rest"><td class="who">unattributed: {rest["processes"]} '
                    f'process{"es" if rest["processes"] != 1 else ""}<div class="sub">{_e(sub)}</div></td>'
                    f'<td class="n" data-label="mem">{_bytes(rest.get("memory_used_bytes"))}</td>'
                    f'<td class="n"></td><td class="n"></td><td class="n"></td></tr>')
    if rows:
        table = ('<table><thead><tr><th>workload</th><th class="n">memory</th><th class="n">SM</th>'
                 '<th class="n">idle</th><th class="n">allocated</th></tr></thead><tbody>'
                 + "".join(rows) + "</tbody></table>")
    else:
        table = '<p class="none">nobody on this GPU</p>'
    return (f'<section class="gpu" id="{anchor}" data-uuid="{_e(gpu.get("uuid", ""))}">{head}{stats}'
            f'<div class="facts">{"".join(f"<span>{f}</span>" for f in facts)}</div>{table}</section>')


def _attention(gpus: Sequence[Mapping[str, Any]], interval: float,
               stuck: Sequence[Mapping[str, Any]] = (), notes: Sequence[str] = ()) -> str:
    items: list[tuple[str, str]] = [("warn", _e(note)) for note in notes]
    for gpu in gpus:
        name = _gpu_name(gpu)
        if not gpu.get("up", True):
            items.append(("bad", f"<b>{_e(name)}</b> is down: {_e(gpu.get('error') or 'not readable')}"))
    for gpu in sorted(gpus, key=health_rank):
        health = gpu.get("health") or {}
        if health.get("state") in ("unhealthy", "degraded"):
            reasons = ", ".join(str(r.get("reason", "")) for r in health.get("reasons") or ())
            items.append(("bad" if health["state"] == "unhealthy" else "warn",
                          f"<b>{_e(_gpu_name(gpu))}</b> is {_e(health['state'])} ({_e(reasons)}): "
                          f"{_e(str(health.get('action', 'none')).replace('_', ' '))}"))
    for call in stuck:
        if not call.get("gpus"):  # a stuck GPU is listed above, down
            items.append(("bad", f"<b>{_e(call.get('what', ''))}</b>: stuck in {_e(call.get('call', ''))} for "
                                 f"{duration(call.get('seconds'))}"))
    items += _stall_items(gpus)
    for gpu in gpus:
        for w in gpu.get("workloads") or ():
            if _is_zombie(w, interval):
                items.append(("bad", f'<b>zombie</b>: {_who(w)} holds {_bytes(w.get("memory_used_bytes"))} on '
                                     f'{_e(_gpu_name(gpu))} at 0% SM (idle {duration(w.get("idle_seconds"))})'))
    for gpu in gpus:
        for w in gpu.get("workloads") or ():
            if w.get("allocated_unused"):
                items.append(("warn", f'<b>allocated, unused</b>: {_who(w)} has {_e(_gpu_name(gpu))} allocated '
                                      f'and runs nothing on it (for {duration(w.get("idle_seconds"))})'))
    if not items:
        items.append(("ok", "nothing needs attention: every GPU is up and healthy, no zombies, no stalls, no "
                            "unused allocations"))
    return '<ul class="attention">' + "".join(f'<li class="{c}">{t}</li>' for c, t in items) + "</ul>"


def with_stalls(doc: dict[str, Any], stalls: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, Any]:
    """``doc`` with each GPU's ``stall`` object (`exporter.stall.watch.gpu_entry`) where ``stalls`` has one."""
    for gpu in doc.get("gpus") or ():
        entry = stalls.get((gpu.get("uuid", ""), gpu.get("gpu_instance", "")))
        if entry is not None:
            gpu["stall"] = dict(entry)
    return doc


def _stall_items(gpus: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The banner's stalled GPUs: "GPU 5 busy with no work for 7m: batch/trainer-3 (job llama-pretrain, rank 13)"."""
    items = []
    for gpu in gpus:
        stall = gpu.get("stall") or {}
        if stall.get("state") == "stalled" and stall.get("headline"):
            items.append(("bad", f'<b>stalled</b>: <span class="stall" data-gpu="{_e(gpu.get("index", ""))}">'
                                 f'{_e(stall["headline"])}</span>'))
    return items


def _workload_key(w: Mapping[str, Any]) -> tuple[Any, ...]:
    """Who a workload row is: the same on every GPU it uses (a trainer on four GPUs has four rows)."""
    return tuple(w.get(key) for key in ("kind", "owner", "namespace", "pod", "container", "pod_uid",
                                        "slurm_job_id", "slurm_step"))


def _summary(gpus: Sequence[Mapping[str, Any]]) -> str:
    up = [g for g in gpus if g.get("up", True)]
    workloads = len({_workload_key(w) for g in up for w in g.get("workloads") or ()})
    used = sum(g.get("memory_used_bytes") or 0 for g in up)
    total = sum(g.get("memory_total_bytes") or 0 for g in up)
    power = [g["power_watts"] for g in up if g.get("power_watts") is not None]
    parts = [f"<b>{len(up)}</b> of <b>{len(gpus)}</b> GPUs up", f"<b>{workloads}</b> workloads"]
    if total:
        parts.append(f"memory <b>{_bytes(used)}</b> of {_bytes(total)}")
    if power:
        parts.append(f"power <b>{sum(power):.0f} W</b>")
    return '<p class="summary">' + " · ".join(parts) + "</p>"


def render_main(doc: Mapping[str, Any] | None, interval: float = 1.0,
                incidents: Sequence[Mapping[str, Any]] = (), notes: Sequence[str] = ()) -> str:
    """The page's ``<main>``: what the script swaps in on every refresh.

    Args:
        doc: a `snapshot_document` (None before the first pass).
        interval: the collection interval, seconds (a zombie is flagged after three passes).
        incidents: the incidents for the "Incidents" panel, newest first.
        notes: what the agent cannot do beside its passes, one line each (e.g. write the
            node's condition), listed first under "attention".
    """
    if doc is None:
        return ('<main data-seq="0" data-ts="0"><p class="none">waiting for the first collection pass'
                '</p></main>')
    gpus = doc.get("gpus") or []
    cards = ("".join(_gpu_card(g, interval) for g in sorted(gpus, key=health_rank))
             or '<p class="none">no GPUs found on this node</p>')
    return (f'<main data-seq="{_e(doc.get("seq", 0))}" data-ts="{_e(doc.get("timestamp", 0))}">'
            f'{_attention(gpus, interval, doc.get("stuck") or (), notes)}{_summary(gpus)}'
            f'{_incidents(incidents, doc.get("timestamp"))}<div class="grid">{cards}</div>'
            '</main>')


def _incidents(incidents: Sequence[Mapping[str, Any]], now: Any, shown: int = 20) -> str:
    """The "Incidents" panel: the newest first, each with GPU, kind, cause, affected, action, age."""
    if not incidents:
        return ""

    def names(key: str, incident: Mapping[str, Any]) -> str:
        return ", ".join(_e(w.get("owner", "")) for w in incident.get(key) or ()) or "—"

    rows = []
    for incident in list(incidents)[:shown]:
        kind = _e(incident.get("kind", ""))
        if incident.get("xid") is not None:
            kind += f" {_e(incident['xid'])}"
        age = duration(float(now) - float(incident.get("time", now))) if isinstance(now, (int, float)) else "n/a"
        cause = names("caused_by", incident) if incident.get("cause_known") else "unknown"
        if incident.get("cause_known") and incident.get("cause_basis"):
            basis = _e(str(incident["cause_basis"]).replace("_", " "))
            cause += f' <span class="basis">({basis})</span>'
        rows.append(f'<tr data-kind="{_e(incident.get("kind", ""))}"><td>GPU&nbsp;{_e(incident.get("gpu", "?"))}</td>'
                    f'<td>{kind}</td><td>{cause}</td><td>{names("affected", incident)}</td>'
                    f'<td>{_e(str(incident.get("action", "")).replace("_", " "))}</td><td class="n">{age} ago</td>'
                    f'<td class="detail">{_e(incident.get("detail", ""))}</td></tr>')
    return ('<section class="incidents"><h2>Incidents</h2><table><thead><tr><th>GPU</th><th>kind</th>'
            '<th>caused by</th><th>affected</th><th>action</th><th class="n">age</th><th>what was seen</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def render_page(doc: Mapping[str, Any] | None, node: str, interval: float, links: Iterable[str] = (),
                version: str = __version__, incidents: Sequence[Mapping[str, Any]] = (),
                notes: Sequence[str] = ()) -> str:
    """The whole HTML document for ``doc`` (a `snapshot_document`, or None before the first pass).

    Args:
        doc: the snapshot document; keys it lacks are shown as "n/a" or left out.
        node: the node name for the title.
        interval: seconds between refreshes (the agent's collection interval).
        links: paths listed in the footer.
        version: the agent's version, shown in the footer.
        incidents: the incidents the agent remembers, newest first (`IncidentWatch.recent_json`).
        notes: what the agent cannot do beside its passes, one line each.
    """
    refresh = max(0.5, interval)
    asof = "n/a"
    if doc is not None and doc.get("timestamp"):
        asof = time.strftime("%H:%M:%S UTC", time.gmtime(float(doc["timestamp"])))
    return _TEMPLATE.substitute(
        title=_e(f"{node} · l9gpu"), node=_e(node), refresh_ms=int(refresh * 1000),
        refresh_s=max(1, round(refresh)), asof=_e(asof), main=render_main(doc, interval, incidents, notes),
        version=_e(version),
        links=" · ".join(f'<a href="{_e(p)}">{_e(p)}</a>' for p in links))


@dataclass(frozen=True)
class _View:
    kind: str
    seq: int
    etag: str
    body: bytes
    zipped: bytes | None = None
    timestamp: float = 0.0  # the snapshot's (Unix seconds)


def server_timing(snapshot_timestamp: float, now: float | None = None) -> str:
    """The ``Server-Timing`` header that tells the page how old the snapshot is.

    ``age`` in milliseconds, by the agent's clock: the page counts staleness from it (and
    from its own monotonic clock since the answer), never comparing the browser's clock
    with the agent's.
    """
    age = max(0.0, (time.time() if now is None else now) - snapshot_timestamp)
    return f'age;desc="snapshot age";dur={age * 1000:.0f}'


class SnapshotPages:
    """Renders ``/`` and ``/api/v1/snapshot`` on request, once per snapshot.

    Used from the event loop only (aiohttp handlers), so it needs no lock: two requests
    for the same snapshot get the same cached bytes. ``renders`` counts renderings by kind
    ("html", "json"), for tests and benchmarks.

    Args:
        get_snapshot: the current snapshot.
        node: the node name (before the first snapshot).
        interval: the collection interval, seconds: how often the page refreshes.
        extra_label_names: the workload label names after the id labels (``label_schema``).
        gpm_status: the backend's GPM status per (GPU index, MIG instance), read once per
            snapshot (see `snapshot_json.snapshot_document`).
        incidents: the incidents for the "Incidents" panel, newest first.
        notes: what the agent cannot do beside its passes, one line each (read once per
            snapshot), listed first under "attention".
        stalls: each GPU's ``stall`` object by (UUID, MIG instance) (`StallWatch.gpu_entries`),
            read once per snapshot into the document; None leaves it out (``--stall-after off``).
    """

    def __init__(self, get_snapshot: Callable[[], Snapshot | None], node: str, interval: float = 1.0,
                 extra_label_names: Sequence[str] = (),
                 gpm_status: Callable[[], Mapping[tuple[int, str], str]] | None = None,
                 incidents: Callable[[], list[dict[str, Any]]] | None = None,
                 notes: Callable[[], Sequence[str]] | None = None,
                 stalls: Callable[[], Mapping[tuple[str, str], Mapping[str, Any]]] | None = None):
        self._get_snapshot = get_snapshot
        self._stalls = stalls
        self._notes = notes
        self._incidents = incidents
        self._gpm_status = gpm_status
        self.node = node
        self.interval = interval
        self.extra_label_names = tuple(extra_label_names)
        self.links: tuple[str, ...] = ()  # the app's other paths, listed in the footer (see add_routes)
        self._boot = os.urandom(4).hex()  # a restarted agent counts seq from 1 again
        self._doc: tuple[int, dict[str, Any]] | None = None
        self._views: dict[str, _View] = {}
        self.renders: dict[str, int] = {"html": 0, "json": 0}

    def _document(self, snap: Snapshot) -> dict[str, Any]:
        if self._doc is None or self._doc[0] != snap.seq:
            doc = snapshot_document(snap, self.extra_label_names, self._read_gpm_status())
            if self._stalls is not None:
                with_stalls(doc, self._stalls())
            self._doc = (snap.seq, doc)
        return self._doc[1]

    def _read_gpm_status(self) -> Mapping[tuple[int, str], str]:
        if self._gpm_status is None:
            return {}
        try:
            return dict(self._gpm_status())
        except RuntimeError:  # the collector thread added a device meanwhile: next snapshot
            return {}

    def view(self, kind: str) -> _View | None:
        """The cached bytes of ``kind`` ("html" or "json") for the current snapshot, or None before one."""
        snap = self._get_snapshot()
        if snap is None:
            return None
        hit = self._views.get(kind)
        if hit is not None and hit.seq == snap.seq:
            return hit
        doc = self._document(snap)
        if kind == "json":
            body = document_json(doc, pretty=False).encode()
        else:
            incidents = self._incidents() if self._incidents is not None else ()
            notes = self._notes() if self._notes is not None else ()
            body = render_page(doc, snap.node or self.node, self.interval, self.links, incidents=incidents,
                               notes=notes).encode()
        self.renders[kind] += 1
        hit = _View(kind, snap.seq, f'"{self._boot}-{snap.seq}-{kind}"', body, timestamp=snap.timestamp)
        self._views[kind] = hit
        return hit

    def _respond(self, request: web.Request, hit: _View, content_type: str) -> web.Response:
        headers = {"ETag": hit.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding",
                   "Server-Timing": server_timing(hit.timestamp)}
        if hit.etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        body = hit.body
        if len(body) >= _GZIP_MIN and "gzip" in request.headers.get("Accept-Encoding", ""):
            if hit.zipped is None:
                hit = replace(hit, zipped=gzip.compress(hit.body, compresslevel=5))
                current = self._views.get(hit.kind)
                if current is not None and current.seq == hit.seq:
                    self._views[hit.kind] = hit
            assert hit.zipped is not None
            body = hit.zipped
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers=headers)

    async def page(self, request: web.Request) -> web.Response:
        """GET /: the page (503 with a waiting page before the first snapshot)."""
        hit = self.view("html")
        if hit is None:
            return web.Response(status=503, content_type="text/html", charset="utf-8",
                                text=render_page(None, self.node, self.interval, self.links),
                                headers={"Cache-Control": "no-cache", "Retry-After": "1"})
        return self._respond(request, hit, "text/html")

    async def api(self, request: web.Request) -> web.Response:
        """GET /api/v1/snapshot: the snapshot JSON (503 with an error object before the first one)."""
        hit = self.view("json")
        if hit is None:
            return web.json_response({"error": "not ready: the first collection pass has not finished"},
                                     status=503, headers={"Retry-After": "1"})
        return self._respond(request, hit, "application/json")

    def add_routes(self, app: web.Application) -> None:
        """Register GET / and GET /api/v1/snapshot on ``app``; the page links every other path it serves."""
        app.router.add_get(PAGE_PATH, self.page)
        app.router.add_get(API_PATH, self.api)
        app.on_startup.append(self._collect_links)

    async def _collect_links(self, app: web.Application) -> None:
        self.links = tuple(r.canonical for r in app.router.resources() if r.canonical != PAGE_PATH)
