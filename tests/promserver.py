"""A real Prometheus server (Debian package `prometheus`) on loopback, for the tests."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from agent import free_port
from waiting import PATIENCE


class PrometheusServer:
    """Prometheus scraping ``targets`` every second, evaluating ``rules``, in ``workdir``.

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
            with urllib.request.urlopen(url, timeout=PATIENCE / 2) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of a query that must succeed."""
        doc = self.query_document(expr)
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 2 * PATIENCE) -> list[dict[str, Any]]:
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
            self.proc.wait(PATIENCE / 2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def evaluate_rules(binary: str, promtool: str, workdir: Path, stages: list[str], start: int, end: int,
                   ready: str, args: list[str] | None = None, timeout: float = 2 * PATIENCE,
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
            subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", f"--start={start}", f"--end={end}",
                            f"--eval-interval={eval_interval}", f"--url={server.base}", f"--output-dir={out}", str(rules)],
                           check=True, cwd=workdir, capture_output=True)
        finally:
            server.stop()
        for block in out.iterdir():
            if block.is_dir():
                block.rename(workdir / "data" / block.name)
