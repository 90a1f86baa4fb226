"""History into a Prometheus TSDB, and a Prometheus on loopback to read it.

What a chargeback needs before it can be tried without a cluster: the agent's counters of
a past period as TSDB blocks (`create_blocks`: ``promtool tsdb create-blocks-from
openmetrics``), a Prometheus (Debian's ``prometheus``) started on them on a free loopback
port (`PrometheusServer`), and the recording rules evaluated over them (`evaluate_rules`:
``promtool tsdb create-blocks-from rules``). ``make demo-report`` (`exporter.report.demo`)
does all three; the tests and ``benchmarks/bench_report.py`` do the same with histories of
their own.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["PrometheusServer", "create_blocks", "evaluate_rules", "finish_blocks", "free_port"]

#: Seconds to wait for Prometheus to start, load its blocks and answer (generous: a busy
#: 2-core machine loads a month of history slowly).
PATIENCE = 120.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def create_blocks(promtool: str, text: Path, out_dir: Path) -> subprocess.Popen:
    """Start ``promtool tsdb create-blocks-from openmetrics`` on ``text`` (OpenMetrics with
    timestamps, each family contiguous, ending in ``# EOF``), writing blocks of up to 32
    days into ``out_dir``; `finish_blocks` waits for it."""
    return subprocess.Popen(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=768h", str(text),
         str(out_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish_blocks(proc: subprocess.Popen) -> None:
    """Wait for a `create_blocks` run; a failure raises RuntimeError with promtool's own words."""
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"promtool failed: {err.decode(errors='replace')[-2000:]}")


class PrometheusServer:
    """Prometheus scraping ``targets`` every second, evaluating ``rules``, in ``workdir``
    (its TSDB in ``workdir``/data), on a free port of 127.0.0.1.

    ``scrape`` adds settings to the scrape job as they are written in prometheus.yml, e.g.
    ``{"scheme": "https", "tls_config": {"ca_file": ...}, "basic_auth": {...}}``.
    ``rules`` is one rule file or several; ``args`` are extra command-line flags (e.g. a
    ``--web.config.file``, or a long retention for backfilled history). ``jobs`` are more
    scrape configs as prometheus.yml writes them (``job_name``, ``static_configs`` with
    their ``labels``, ``relabel_configs``, ...), scraped every second too. ``settings`` are
    more ``global:`` settings (e.g. ``{"query_log_file": "/tmp/query.log"}``).
    """

    def __init__(self, binary: str, workdir: Path, targets: list[str], rules: Path | list[Path] | None = None,
                 scrape: dict[str, Any] | None = None, args: list[str] | None = None,
                 jobs: list[dict[str, Any]] | None = None, settings: dict[str, Any] | None = None):
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        rule_files = [rules] if isinstance(rules, Path) else list(rules or [])
        self.args = list(args or [])
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            + "".join(f"  {key}: {json.dumps(value)}\n" for key, value in (settings or {}).items())
            + (f"rule_files: {json.dumps([str(r) for r in rule_files])}\n" if rule_files else "")
            + "scrape_configs:\n  - job_name: l9gpu\n"
            + f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
            + "".join(f"    {key}: {json.dumps(value)}\n" for key, value in (scrape or {}).items())
            + "".join(f"  - {json.dumps(job)}\n" for job in jobs or ()))
        self.config = config
        self.proc: subprocess.Popen | None = None

    def start(self) -> PrometheusServer:
        self._log = open(self.workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", *self.args], stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    def query_document(self, expr: str) -> dict[str, Any]:
        """The API's whole answer, errors included (a 400 carries a JSON body)."""
        url = self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=PATIENCE / 4) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of a query that must succeed."""
        doc = self.query_document(expr)
        if doc.get("status") != "success":
            raise RuntimeError(f"query {expr} failed: {doc}")
        return doc["data"]["result"]

    def wait_for(self, expr: str, timeout: float = PATIENCE) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns data (Prometheus starts, scrapes every second, then
        evaluates: on a busy machine that can take a while, so the default is generous)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + self.log())
            try:
                result = self.query(expr)
                if result:
                    return result
            except (OSError, ValueError):  # not listening yet, or 503 (not JSON) while it loads its blocks
                pass
            time.sleep(0.25)
        raise TimeoutError(f"no result for {expr} after {timeout}s:\n" + self.log())

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(PATIENCE / 4)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def evaluate_rules(binary: str, promtool: str, workdir: Path, stages: list[str], start: int, end: int,
                   ready: str, args: list[str] | None = None, timeout: float = PATIENCE,
                   eval_interval: str = "1h") -> None:
    """Recording rules evaluated hour by hour over the history in ``workdir``/data, as
    ``promtool tsdb create-blocks-from rules`` does for rules added to a running
    Prometheus, and their blocks moved into the TSDB. promtool lets no rule read another's
    results, so rules that read other rules come as ``stages``: a rule file's text per
    pass, each pass reading the records of the passes before. Every pass is written to the
    same file: a group is evaluated at an offset in its interval that depends on its name
    and file, and a rule reads the record of the pass before at its own evaluation time.
    ``ready``: a query that answers once Prometheus has loaded the history; ``eval_interval``:
    the step of the evaluations (the rule groups' interval)."""
    rules = workdir / "rules.yaml"
    for index, text in enumerate(stages):
        rules.write_text(text)
        out = workdir / f"rules-blocks-{index}"
        server = PrometheusServer(binary, workdir, [], args=args).start()
        try:
            server.wait_for(ready, timeout=timeout)
            done = subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", f"--start={start}",
                                   f"--end={end}", f"--eval-interval={eval_interval}", f"--url={server.base}",
                                   f"--output-dir={out}", str(rules)], cwd=workdir, capture_output=True)
        finally:
            server.stop()
        if done.returncode != 0:
            raise RuntimeError(f"promtool failed: {done.stderr.decode(errors='replace')[-2000:]}")
        for block in out.iterdir():
            if block.is_dir():
                block.rename(workdir / "data" / block.name)
