"""``l9gpu report`` (chargeback from Prometheus) and ``l9gpu prices`` (prices -> rules).

Mistakes in flags or in the prices file print one line and exit 2; a Prometheus that
cannot be reached or refuses a query prints one line and exits 1. Nothing is written to
``--output`` unless the whole report was computed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

from exporter.core.outputs import CommandFailed, check_output, write_output
from exporter.inference import cli as inference_cli
from exporter.inference.cli import load_engines_or_fail
from exporter.report.progress import Progress, progress_for

COMMANDS = ("report", "prices", "inference-rules")
BY = re.compile(r"^(namespace|model|job|training_job|slurm_account|slurm_user|label_[a-zA-Z0-9_]+)$")


def add_parsers(sub: Any) -> list[argparse.ArgumentParser]:
    """Add the ``report``, ``prices`` and ``inference-rules`` subcommands to the ``l9gpu`` parser."""
    report = sub.add_parser("report", help="chargeback: GPU-hours, energy, cost and waste per team from Prometheus",
                            description="GPU-hours used and allocated, waste, zombie hours, energy and cost per "
                                        "namespace, pod label, Slurm account or Slurm user over a period, from the "
                                        "agent's counters in Prometheus (see docs/CHARGEBACK.md).")
    report.add_argument("--prometheus", metavar="URL",
                        help="base URL of Prometheus (or a compatible API), e.g. http://prometheus:9090 (required)")
    report.add_argument("--from", dest="start", metavar="START",
                        help="start: 2026-11-01, 2026-11-01T08:00Z, a Unix timestamp, or a time before now (30d) "
                             "(required)")
    report.add_argument("--to", dest="end", default="now", metavar="END", help="end, same forms (default: now)")
    report.add_argument("--by", default="namespace", metavar="LABEL",
                        help="group by namespace, model (the model each inference engine serves: tokens and cost "
                             "per million tokens, see docs/INFERENCE.md), job (the training job each workload is a "
                             "rank of, see docs/TRAINING.md), label_<key> (a --pod-label of the agents), "
                             "slurm_account or slurm_user (default: namespace)")
    report.add_argument("--engines", metavar="FILE",
                        help="with --by model: inference engines to read besides (or instead of) the built-in "
                             "vLLM, SGLang, TGI, Triton TensorRT-LLM and NIM (YAML, see docs/INFERENCE.md)")
    report.add_argument("--prices", metavar="FILE", help="prices file (YAML, see docs/CHARGEBACK.md): adds costs")
    report.add_argument("--carbon-intensity-query", metavar="PROMQL",
                        help="grid carbon intensity in gCO2e per kWh as a Prometheus query (e.g. what an Electricity "
                             "Maps or WattTime exporter publishes), averaged over each step; one series, or one per "
                             "value of the prices file's carbon.label; adds carbon_gco2e per group "
                             "(docs/CHARGEBACK.md)")
    report.add_argument("--format", choices=("csv", "json", "html"),
                        help="output format (default: from the --output extension, else csv)")
    report.add_argument("--output", "-o", metavar="FILE", help="write here instead of standard output")
    report.add_argument("--top", type=int, default=5, metavar="N", help="top wasting workloads per group (default: 5)")
    report.add_argument("--step", metavar="DURATION",
                        help="resolution of the counter scan (default: 5m to 1d, at most ~130 steps per period); "
                             "results do not depend on it, only the query cost does")
    report.add_argument("--source", choices=("auto", "raw", "rules"), default="auto",
                        help="raw: the agent's counters, exact; rules: the chargeback recording rules "
                             "(alerts/l9gpu-chargeback.rules.yaml), a few series per namespace, within the error "
                             "bound the report states; auto: the rules where they cover the period and the report "
                             "(--by namespace), else raw (default: auto)")
    report.add_argument("--selector", default="", metavar="MATCHERS",
                        help='extra label matchers for every series, e.g. cluster="eu-1"')
    report.add_argument("--timings", action="store_true",
                        help="print on standard error how long reading Prometheus' answers (the server's work and "
                             "the transfer) and summarising them (the report's) took")
    report.add_argument("--quiet", "-q", action="store_true",
                        help="show no progress line; without it a terminal (standard error) shows the queries "
                             "answered, the phase and the time elapsed, when tqdm is installed (the report extra); "
                             "notes and errors are printed either way")
    auth = report.add_argument_group("Prometheus connection")
    auth.add_argument("--bearer-token", metavar="TOKEN", help="send Authorization: Bearer TOKEN")
    auth.add_argument("--bearer-token-file", metavar="FILE", help="read the bearer token from FILE")
    auth.add_argument("--username", help="basic auth user")
    auth.add_argument("--password", help="basic auth password (prefer --password-file)")
    auth.add_argument("--password-file", metavar="FILE", help="read the basic auth password from FILE")
    auth.add_argument("--ca-file", metavar="FILE", help="CA certificates to verify Prometheus' TLS certificate")
    auth.add_argument("--cert-file", metavar="FILE", help="client certificate (with --key-file) for mutual TLS")
    auth.add_argument("--key-file", metavar="FILE", help="client certificate key")
    auth.add_argument("--insecure-skip-verify", action="store_true", help="do not verify the server certificate")
    auth.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                      help="send this request header too (repeatable), e.g. 'X-Scope-OrgID: tenant-1' for Grafana "
                           "Mimir or Cortex; values are never printed")
    auth.add_argument("--timeout", default="2m", metavar="DURATION", help="per query (default: 2m)")
    auth.add_argument("--max-response-bytes", default="256MiB", metavar="SIZE",
                      help="give up on an answer larger than this, decompressed, e.g. 64MiB, 1GiB "
                           "(default: 256MiB)")

    prices = sub.add_parser("prices", help="check a prices file and write it as Prometheus recording rules",
                            description="Validate a prices file and print the recording rules that give the "
                                        "chargeback rules and the Grafana dashboard the same prices.")
    prices.add_argument("file", metavar="FILE", help="prices file (YAML)")
    prices.add_argument("--output", "-o", metavar="FILE", help="write the rules here instead of standard output")

    rules = inference_cli.add_parser(sub)
    return [report, prices, rules]


def run(args: argparse.Namespace) -> int:
    """Run ``report`` or ``prices``; the exit status."""
    try:
        if args.command == "prices":
            return _prices(args)
        if args.command == "inference-rules":
            return inference_cli.run(args)
        return _report(args)
    except CommandFailed as exc:
        print(f"l9gpu {args.command}: {exc}", file=sys.stderr)
        return exc.status


def _prices(args: argparse.Namespace) -> int:
    from exporter.report.prices import PricesError, load_prices, recording_rules

    check_output(args.output)
    try:
        prices = load_prices(args.file)
    except PricesError as exc:
        raise CommandFailed(str(exc)) from None
    write_output(args.output, recording_rules(prices))
    return 0


def _report(args: argparse.Namespace) -> int:
    from exporter.report import compute, output, summary
    from exporter.report.periods import parse_period, parse_prometheus_duration
    from exporter.report.prices import PricesError, load_prices
    from exporter.report.prom import config_from_args, parse_size

    for flag, value in (("--prometheus", args.prometheus), ("--from", args.start)):
        if not value:  # required, from the command line or L9GPU_PROMETHEUS / L9GPU_FROM
            raise CommandFailed(f"{flag} is required")
    if not BY.match(args.by):
        raise CommandFailed(f"--by {args.by!r}: use namespace, model, job, label_<key>, slurm_account or slurm_user")
    if args.by == "job":
        args.by = summary.JOB_BY
    if args.top < 0:
        raise CommandFailed("--top must be 0 or more")
    fmt = args.format
    if fmt is None:
        suffix = Path(args.output).suffix.lower().lstrip(".") if args.output else ""
        fmt = suffix if suffix in output.FORMATS else "csv"
    if fmt == "html":
        try:
            import jinja2  # noqa: F401
        except ImportError:
            raise CommandFailed("the HTML report needs jinja2: pip install '.[report]' in l9gpu's checkout") from None
    check_output(args.output)
    now = time.time()
    try:
        start, end = parse_period(args.start, args.end, now)
        timeout = parse_prometheus_duration(args.timeout)
        step = parse_prometheus_duration(args.step) if args.step else None
    except ValueError as exc:
        raise CommandFailed(str(exc)) from None
    try:
        max_response_bytes = parse_size(args.max_response_bytes)
    except ValueError as exc:
        raise CommandFailed(f"--max-response-bytes: {exc}") from None
    start_ms, end_ms = int(start) * 1000, int(end) * 1000
    if end_ms <= start_ms:
        raise CommandFailed("the period is shorter than a second")
    step_s = int(step) if step else compute.choose_step((end_ms - start_ms) / 1000)
    if step_s < 60:
        raise CommandFailed("--step must be at least 1m")
    if (end_ms - start_ms) / (step_s * 1000) > 11000:
        raise CommandFailed(f"--step {args.step}: over 11,000 steps in the period (Prometheus' limit per series); "
                    "use a longer step")
    # an --engines file is checked whatever --by; only --by model reads the engines' counters
    engines = load_engines_or_fail(args.engines) if args.by == summary.MODEL_BY or args.engines else ()
    if args.by != summary.MODEL_BY:
        engines = ()
    prices = None
    if args.prices:
        try:
            prices = load_prices(args.prices)
        except PricesError as exc:
            raise CommandFailed(str(exc)) from None
    try:
        config = config_from_args(
            args.prometheus, bearer_token=args.bearer_token, bearer_token_file=args.bearer_token_file,
            username=args.username, password=args.password, password_file=args.password_file,
            ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file,
            insecure_skip_verify=args.insecure_skip_verify, timeout=timeout, headers=args.header,
            max_response_bytes=max_response_bytes)
    except ValueError as exc:
        raise CommandFailed(str(exc)) from None

    progress = progress_for(sys.stderr, args.quiet)
    try:
        report = _compute(args, config, engines, prices, (start_ms, end_ms, step_s), progress)
        progress.phase(f"writing {fmt}")
        text = output.FORMATS[fmt](report)
    finally:
        progress.close()
    write_output(args.output, text)
    return 0


async def _ticking(work: Any, progress: Progress) -> Any:
    """Await `work`, redrawing `progress` twice a second so that the elapsed time moves on
    while one long query runs."""
    async def tick() -> None:
        while True:
            await asyncio.sleep(0.5)
            progress.refresh()

    ticker = asyncio.create_task(tick())
    try:
        return await work
    finally:
        ticker.cancel()


def _compute(args: argparse.Namespace, config: Any, engines: Any, prices: Any, period: tuple[int, int, int],
             progress: Progress) -> dict[str, Any]:
    """Fetch the period's counters and summarise them (the report as a document); notes on stderr."""
    from exporter.report import carbon, compute, fetch, rules, summary
    from exporter.report.prices import PricesError
    from exporter.report.prom import Prometheus, PrometheusError

    start_ms, end_ms, step_s = period

    def note(line: str) -> None:
        progress.note(f"l9gpu report: note: {line}", sys.stderr)

    # what the server sums by: the grouping and every label a price depends on
    price_keys = {"model"}
    for rule in prices.overrides if prices is not None else ():
        price_keys.update(key for key, _ in rule.match)
    carbon_label = prices.carbon.label if prices is not None and prices.carbon is not None else None
    group_by = sorted(price_keys | {args.by} | ({carbon_label} if carbon_label else set()))
    why_not_rules = rules.usable(args.by, args.selector.strip(), price_keys, bool(args.engines))
    if carbon_label and not why_not_rules:
        why_not_rules = f"carbon intensity per {carbon_label}: the rules keep no label but namespace and model"
    query = (args.carbon_intensity_query or "").strip()

    async def intensity(prom: Prometheus) -> Any:
        if not query:
            return None if prices is None or prices.carbon is None else carbon.Intensity(prices.carbon)
        grid = compute.Grid(start_ms, end_ms, step_s * 1000)
        return await carbon.fetch_intensity(prom, grid, query, prices.carbon if prices is not None else None)
    if args.source == "rules" and why_not_rules:
        raise CommandFailed(f"--source rules: {why_not_rules}; use --source raw")

    async def go() -> Any:
        async with Prometheus(config, progress) as prom:
            if args.source != "raw" and not why_not_rules:
                progress.phase("reading counters")
                grid = compute.Grid(start_ms, end_ms, step_s * 1000)
                recorded = await _ticking(rules.fetch(prom, grid, compute.FetchStats(), args.by == summary.MODEL_BY,
                                                      args.by == summary.JOB_BY), progress)
                whole = recorded is not None and recorded.hours_evaluated >= int(recorded.hours) - 1
                if recorded is not None and (whole or args.source == "rules"):
                    return recorded, await intensity(prom), prom
                if args.source == "rules":
                    raise PrometheusError("--source rules: Prometheus has no chargeback recording rules in this "
                                          "period (load alerts/l9gpu-chargeback.rules.yaml, or use --source raw)")
            fetched = await _ticking(fetch.fetch(prom, start_ms, end_ms, step_s * 1000, args.selector.strip(),
                                                 engines, progress, group_by), progress)
            return fetched, await intensity(prom), prom

    began = time.perf_counter()
    try:
        fetched, grid_intensity, prom = asyncio.run(go())
    except (PrometheusError, carbon.IntensityError) as exc:
        raise CommandFailed(str(exc), status=1) from None
    queries = prom.queries
    if prom.splits:
        note(f"{prom.splits} range queries were more than Prometheus evaluates at once (its --query.max-samples or "
             "--query.timeout) and were asked again in shorter ranges; the figures are the same")
    read_s = time.perf_counter() - began
    if isinstance(fetched, rules.Recorded):
        return _from_rules(args, config, prices, fetched, queries, (start_ms, end_ms, step_s), note, read_s,
                           grid_intensity)
    progress.phase("summarising")
    grid, series, stats = fetched.grid, fetched.series, fetched.stats
    if args.by == summary.MODEL_BY:
        if not fetched.tokens:
            note("Prometheus has no inference engine token series with a pod label in this period (engines "
                 f"read: {', '.join(e.name for e in engines)}); every workload is in group {summary.NONE_GROUP}")
    elif series and args.by not in ("namespace",) and not any(s.labels.get(args.by) for s in series):
        hint = (f" (run the agents with --pod-label {args.by[len('label_'):]})" if args.by.startswith("label_")
                else "")
        note(f"no series carries {args.by}{hint}; everything is in group {summary.NONE_GROUP}")
    if not series:
        note("Prometheus has no l9gpu workload series in this period")
    source: dict[str, Any] = {"prometheus": config.url, "counters": "raw", "step_seconds": step_s,
                              "queries": stats.queries, "series": stats.series, "raw_steps": stats.raw_steps,
                              "error_bound_gpu_hours": 0.0}
    if config.headers:
        source["headers"] = config.header_names  # names only: values may be credentials
    began = time.perf_counter()
    try:
        report = summary.summarize(series, grid, args.by, prices, top=args.top, source=source,
                                   devices=fetched.devices, tokens=fetched.tokens, idle=fetched.idle,
                                   steps=fetched.steps, device_steps=fetched.device_steps, intensity=grid_intensity)
    except PricesError as exc:
        raise CommandFailed(str(exc)) from None
    if args.timings:
        _timings(read_s, queries, time.perf_counter() - began)
    if fetched.unjoined:
        report["notes"].append(f"{fetched.unjoined} inference engine series have no pod label, so their tokens join "
                               "no workload and are left out; scrape the engines' pods so that Prometheus adds "
                               "namespace and pod (docs/INFERENCE.md)")
    for line in report["notes"]:
        note(line)
    return report


def _timings(read_s: float, queries: int, summarise_s: float) -> None:
    """How long the server took (reading the answers) and the report (summarising), on stderr."""
    print(f"l9gpu report: timings: {queries} queries read in {read_s:.2f} s, summarised in {summarise_s:.2f} s",
          file=sys.stderr)


def _from_rules(args: argparse.Namespace, config: Any, prices: Any, recorded: Any, queries: int,
                period: tuple[int, int, int], note: Any, read_s: float, intensity: Any) -> dict[str, Any]:
    """The report from the chargeback recording rules (`exporter.report.rules`)."""
    from exporter.report import compute, rules, summary
    from exporter.report.prices import PricesError

    start_ms, end_ms, step_s = period
    grid = compute.Grid(start_ms, end_ms, step_s * 1000)
    bound = round(recorded.error_bound_seconds / 3600, 6)
    source: dict[str, Any] = {"prometheus": config.url, "counters": "rules", "step_seconds": step_s,
                              "queries": queries, "series": len(recorded.series), "raw_steps": 0,
                              "error_bound_gpu_hours": bound, "rules_hours_evaluated": recorded.hours_evaluated}
    if config.headers:
        source["headers"] = config.header_names
    began = time.perf_counter()
    try:
        report = summary.summarize(recorded.series, grid, args.by, prices, top=0, source=source,
                                   devices=recorded.devices, intensity=intensity, recorded_models=recorded.models)
    except PricesError as exc:
        raise CommandFailed(str(exc)) from None
    if args.timings:
        _timings(read_s, queries, time.perf_counter() - began)
    if args.by == summary.JOB_BY:
        what = "hourly figures per namespace, training job and GPU model"
    elif recorded.models is None:
        what = "hourly figures per namespace and GPU model"
    else:
        what = ("hourly figures per namespace, served model and GPU model, each pod's hour split between its models "
                "by their tokens in the hour (replicas: the most that served a model in one hour)")
    report["notes"].insert(0, f"read from the chargeback recording rules: {what}; "
                              f"the hours at the period's two ends may be off by up to {bound:g} allocated "
                              "GPU-hours in all, an hour with an agent restart counts what increase() estimates, "
                              "and no workload is named (--source raw reads the agent's counters exactly)")
    unsplit = sum(s.total("allocated") for s in recorded.series if s.labels.get("model_name") == rules.UNSPLIT_GROUP)
    if unsplit:
        report["notes"].append(f"{unsplit:g} GPU-hours of pods on GPUs of several models serving several "
                               f"models are in group {rules.UNSPLIT_GROUP}: the rules cannot split them "
                               "(--source raw does)")
    missing = int(recorded.hours) - recorded.hours_evaluated
    if missing > 1:
        report["notes"].append(f"the recording rules were not evaluated in {missing} of the period's "
                               f"{int(recorded.hours)} hours (Prometheus down, or the rules loaded since): their "
                               "figures are missing; use --source raw for this period")
    for line in report["notes"]:
        note(line)
    return report
