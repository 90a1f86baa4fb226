"""The docs name only what exists, and the README's snapshot sample is what the simulated node prints.

Every flag, make target, metric, alert, Helm value and repository path that README.md,
docs/*.md and the chart's README name in code (spans and blocks) is looked up where it is
defined: the `l9gpu ... --help` output, the Makefile, exporter/output/catalogue.py and the DCGM
field table, the rules files, values.yaml, the file tree. A doc that names one that is not
there fails here, with the doc and the name.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from agent import run_cli

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "l9gpu"
DOCS = sorted([REPO / "README.md", CHART / "README.md", *(REPO / "docs").glob("*.md")])

SUBCOMMANDS = ("serve", "snapshot", "report", "prices", "inference-rules")

# Flags of the other tools the docs show commands of (kubectl, helm, docker, promtool, curl,
# pip, systemd, Prometheus and dcgm-exporter, which the migration guide compares with).
EXTERNAL_FLAGS = frozenset({
    # helm
    "--set", "--namespace", "--create-namespace", "--install", "--reuse-values", "--values",
    # kubectl
    "--from-file", "--from-literal", "--field-selector", "--all-namespaces", "--dry-run",
    # docker
    "--rm", "--pid", "--gpus", "--platform",
    # pip, curl, promtool, stress-ng
    "--upgrade", "--no-deps", "--only-binary", "--target", "--silent", "--cpu", "--timeout",
    # the kubelet's, chromium's, SGLang's
    "--cgroups-per-qos", "--dump-dom", "--enable-metrics",
    # Prometheus' and Mimir's (docs/CHARGEBACK.md), exporter-toolkit's
    "--storage.tsdb.retention.time", "--query.max-samples", "--query.timeout", "--query.enforce-tenancy", "--query.tenant-header", "--web.config.file",
    # promtool tsdb create-blocks-from rules (docs/CHARGEBACK.md)
    "--start", "--eval-interval",
    # dcgm-exporter's (docs/MIGRATING-FROM-DCGM.md compares with them)
    "--collectors", "--no-hostname", "--kubernetes-gpu-id-type", "--configmap-data", "--use-old-namespace",
    "--kubernetes-enable-pod-labels", "--kubernetes-enable-pod-uid", "--kubernetes-virtual-gpus",
})

# Names of other exporters the docs join with or compare to: cAdvisor's series, the cache
# gauge NVIDIA NIM serves under this name (docs/INFERENCE.md), dcgm-exporter's old label.
EXTERNAL_METRICS = frozenset({"container_cpu_usage_seconds_total", "gpu_cache_usage_perc", "container_name"})

# A value the chart README shows misspelt on purpose, to show the schema refusing it.
MISSPELT_ON_PURPOSE = frozenset({"polling.intervall"})

# Series that the GPU-health and incident work add; the docs may name them before their
# families reach exporter/output/catalogue.py (then they are found there and this list can go).
PENDING_METRICS = frozenset({
    "gpu_health", "gpu_health_action", "gpu_health_reason", "gpu_health_transitions_total",
    "gpu_remapped_rows_total", "gpu_pcie_replays_total", "gpu_violation_seconds_total",
    "gpu_unhealthy_seconds_total", "container_gpu_incidents_total",
    "container_gpu_memory_peak_bytes", "gpu_memory_peak_bytes",
})
PENDING_METRIC_PREFIXES = ("gpu_row_remap_", "gpu_pcie_link_", "gpu_nvlink_")

FLAG = re.compile(r"(?<![\w./-])(--[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)*)")
MAKE = re.compile(r"(?<![\w-])make ([a-z][a-z0-9-]*)")
METRIC = re.compile(r"(?<![\w:.{/-])((?:gpu|container|l9gpu|DCGM_FI)_[A-Za-z0-9_]*[A-Za-z0-9])(?![\w:(/.-])")
RECORD = re.compile(r"(?<![\w.{/-])([a-z_]+:[a-z0-9_]+(?::[a-z0-9]+)?)(?![\w:(])")
ALERT = re.compile(r"(?<![\w-])((?:GPU|L9gpu)[A-Z][A-Za-z]+)(?![\w-])")
SET = re.compile(r"--set(?:=|\s+)['\"]?([A-Za-z][\w.]*)=")
PATH = re.compile(r"(?<![\w./-])((?:exporter|docs|tests|benchmarks|alerts|charts|deploy|dashboards|bridge)/[\w./*-]*[\w*/])")


# --- what the docs say ---------------------------------------------------------------------

def code_of(text: str) -> Iterator[str]:
    """The text of every fenced block and every code span of a markdown document."""
    blocks = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
    for match in blocks.finditer(text):
        yield match.group(1)
    rest = blocks.sub("", text)
    for match in re.finditer(r"(`+)(.+?)\1", rest, re.S):
        yield match.group(2)


@cache
def code(doc: Path) -> tuple[str, ...]:
    return tuple(code_of(doc.read_text()))


def references(doc: Path) -> tuple[str, ...]:
    """Code that names files: every chunk but the program output shown in ```text blocks
    (a pod named docs/ocr-worker is not a path)."""
    text = re.sub(r"^```text\n.*?^```", "", doc.read_text(), flags=re.M | re.S)
    return tuple(code_of(text))


def named(doc: Path, pattern: re.Pattern[str]) -> set[str]:
    return {m.group(1) for chunk in code(doc) for m in pattern.finditer(chunk)}


# --- where they are defined -----------------------------------------------------------------

@cache
def known_flags() -> frozenset[str]:
    flags: set[str] = set()
    for command in [[], *([sub] for sub in SUBCOMMANDS)]:
        result = run_cli([*command, "--help"])
        assert result.returncode == 0, (command, result.stderr)
        flags |= set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", result.stdout))
    # the benchmarks' own flags (docs/PERFORMANCE.md runs them), `python -m exporter.health
    # --markdown` and `python -m exporter.report.rules --stage`, read from their argument
    # parsers' source rather than by running them
    for source in [*(REPO / "benchmarks").glob("*.py"), REPO / "exporter" / "health" / "policy.py",
                   REPO / "exporter" / "report" / "rules.py"]:
        flags |= set(re.findall(r"""["'](--[a-z][a-z0-9-]*)["']""", source.read_text()))
    return frozenset(flags)


@cache
def make_targets() -> frozenset[str]:
    text = (REPO / "Makefile").read_text()
    return frozenset(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))


@cache
def rules() -> list[dict[str, Any]]:
    found = []
    for path in sorted((REPO / "alerts").glob("*.rules.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += group["rules"]
    # what `l9gpu prices` writes: the example file, and a namespace override of every kind
    namespace_override = REPO / "tests" / "data" / "prices-namespace-override.yaml"
    for prices_file in (REPO / "alerts" / "prices.example.yaml", namespace_override):
        prices = run_cli(["prices", str(prices_file)])
        assert prices.returncode == 0, prices.stderr
        for group in yaml.safe_load(prices.stdout)["groups"]:
            found += group["rules"]
    return found


@cache
def known_metrics() -> frozenset[str]:
    sys.path.insert(0, str(REPO))
    from exporter.output.catalogue import BY_NAME

    names = set(BY_NAME)
    for module in (REPO / "exporter" / "output" / "dcgm").glob("*.py"):  # the DCGM schema's field tables
        names |= set(re.findall(r"DCGM_FI_[A-Z0-9_]+", module.read_text()))
    from exporter.output.dcgm.fields import FIELDS

    names |= {field.name for field in FIELDS}  # with those the catalogue's rows declare
    names |= {rule["record"] for rule in rules() if "record" in rule}
    return frozenset(names)


@cache
def names_in_code() -> frozenset[str]:
    """Quoted names the agent's code spells (label names, JSON and report keys, health
    reasons, price keys): `gpu_instance` in a doc is one of those, not a series."""
    found: set[str] = set()
    for source in (REPO / "exporter").rglob("*.py"):
        found |= set(re.findall(r"""["']((?:gpu|container|l9gpu)_[a-z0-9_]+)["']""", source.read_text()))
    return frozenset(found - known_metrics())


def metric_exists(name: str) -> bool:
    known = known_metrics()
    if name in known or name in PENDING_METRICS or name.startswith(PENDING_METRIC_PREFIXES):
        return True
    if name in EXTERNAL_METRICS or name in names_in_code():
        return True
    # a family's prefix (`gpu_gpm_*`, `DCGM_FI_PROF_*` written as DCGM_FI_PROF) or an
    # OpenMetrics sample of a counter (`_created`)
    base = name.removesuffix("_created")
    return base in known or any(k.startswith(name + "_") for k in known)


@cache
def alerts() -> frozenset[str]:
    """The alerts of the rules files, and the reasons of the Kubernetes Events the agent posts
    (written the same way: GPUFaultCaused, ...)."""
    sys.path.insert(0, str(REPO))
    from exporter.incidents.engine import EVENT_REASONS
    from exporter.nodestatus.condition import EVENT_REASONS as NODE_EVENT_REASONS
    from exporter.stall.messages import EVENT_ENDED_REASON, EVENT_REASON

    return frozenset(rule["alert"] for rule in rules() if "alert" in rule) | EVENT_REASONS | frozenset(
        NODE_EVENT_REASONS.values()) | {EVENT_REASON, EVENT_ENDED_REASON}


@cache
def values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


# Values that hold a Kubernetes object of the user's (any key below them is theirs).
KUBERNETES_FIELDS = frozenset({"securityContext", "podSecurityContext", "resources", "nodeSelector", "affinity",
                               "livenessProbe", "readinessProbe", "updateStrategy"})


def value_exists(path: str) -> bool:
    """A dotted Helm value path in values.yaml; below an empty map (labels, annotations) or
    a Kubernetes field any key is the user's own."""
    node: Any = values()
    for part in path.split("."):
        if not isinstance(node, dict):
            return False
        if part not in node:
            return node == {} or path.split(".")[0] in KUBERNETES_FIELDS
        node = node[part]
    return True


def values_table_names(doc: Path) -> set[str]:
    """The Helm values a doc's values table lists in its first column (`a.b`, `.c` continuing it)."""
    names: set[str] = set()
    text = doc.read_text()
    table = text[text.index("## Values"):]
    table = table[:table.find("\n## ", 1)]
    for line in table.splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        last = ""
        for name in re.findall(r"`([A-Za-z.][\w.]*)`", cells[1]):
            if name.startswith("."):
                name = last.rsplit(".", 1)[0] + name
            names.add(name)
            last = name
    return names


def path_exists(doc: Path, path: str) -> bool:
    path = path.split("::")[0].rstrip("/")
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path).exists()


# --- the checks ------------------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_flag_a_doc_names_exists(doc):
    unknown = named(doc, FLAG) - known_flags() - EXTERNAL_FLAGS
    assert not unknown, f"{doc.relative_to(REPO)} names flags no `l9gpu ... --help` lists: {sorted(unknown)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_make_target_a_doc_names_exists(doc):
    unknown = named(doc, MAKE) - make_targets()
    assert not unknown, f"{doc.relative_to(REPO)} names make targets the Makefile lacks: {sorted(unknown)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_metric_a_doc_names_exists(doc):
    unknown = {name for name in named(doc, METRIC) if not metric_exists(name)}
    unknown |= {name for name in named(doc, RECORD) if name.split(":")[0] in ("namespace", "namespace_model", "model", "node", "gpu")
                and name not in known_metrics()}
    assert not unknown, f"{doc.relative_to(REPO)} names series nothing exports or records: {sorted(unknown)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_alert_a_doc_names_exists(doc):
    unknown = named(doc, ALERT) - alerts()
    assert not unknown, f"{doc.relative_to(REPO)} names alerts no rules file has: {sorted(unknown)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_helm_value_a_doc_names_exists(doc):
    names = named(doc, SET)
    if doc == CHART / "README.md":
        names |= values_table_names(doc)
    unknown = {name for name in names - MISSPELT_ON_PURPOSE if not value_exists(name)}
    assert not unknown, f"{doc.relative_to(REPO)} names Helm values values.yaml lacks: {sorted(unknown)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_doc_names_exists(doc):
    text = doc.read_text()
    paths = {m.group(1) for chunk in references(doc) for m in PATH.finditer(chunk)}
    unknown = {path for path in paths if not path_exists(doc, path)}
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target and not (doc.parent / target).exists():
            unknown.add(target)
    assert not unknown, f"{doc.relative_to(REPO)} names files that do not exist: {sorted(unknown)}"


# --- installing l9gpu -----------------------------------------------------------------------

# The names this project could be fetched by from the package index: none is this project
# there (the index's "l9gpu" is another project's agent), so every install is from the
# checkout or from the wheel `make dist` builds from it.
OWN_DISTRIBUTIONS = frozenset({"l9gpu", "l9gpu-agent"})
PIP_INSTALL = re.compile(r"(?:\bpip3?|python3? -m pip|\buv pip|\bpipx)\s+install\s+([^\n;&|)#`]*)")
# Where else users read install commands: the agent's messages, the image and the Makefile.
INSTALL_SOURCES = sorted([*(REPO / "exporter").rglob("*.py"), *(REPO / "bridge").rglob("*.py"),
                          REPO / "charts" / "package.py", REPO / "Makefile", REPO / "Dockerfile",
                          *(REPO / "benchmarks").glob("*.sh")])


def fetched_from_the_index(text: str) -> set[str]:
    """The requirements of each `pip install` in text that name this project by its name
    (so pip would look it up on the package index) rather than a path or a wheel file."""
    found = set()
    for match in PIP_INSTALL.finditer(text):
        for token in match.group(1).split():
            token = token.strip("'\"\\")
            if not token or token.startswith("-") or token.startswith((".", "/", "~", "$")) or "/" in token \
                    or token.endswith((".whl", ".tar.gz", ".zip")):
                continue
            name = re.split(r"[\[<>=!~;@ ]", token, maxsplit=1)[0]
            if re.sub(r"[-_.]+", "-", name).lower() in OWN_DISTRIBUTIONS:
                found.add(token)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_doc_installs_l9gpu_from_the_package_index(doc):
    fetched = {token for chunk in code(doc) for token in fetched_from_the_index(chunk)}
    assert not fetched, (f"{doc.relative_to(REPO)} installs {sorted(fetched)} from the package index, where "
                         "l9gpu is another project: install from the checkout ('.[all]') or the wheel of make dist")


@pytest.mark.parametrize("source", INSTALL_SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_message_installs_l9gpu_from_the_package_index(source):
    fetched = fetched_from_the_index(source.read_text())
    assert not fetched, f"{source.relative_to(REPO)} tells users to install {sorted(fetched)} from the package index"


def test_the_install_check_tells_the_index_from_the_checkout():
    assert fetched_from_the_index("pip install 'l9gpu[all]'") == {"l9gpu[all]"}
    assert fetched_from_the_index("python -m pip install --upgrade l9gpu-agent==0.2.0") == {"l9gpu-agent==0.2.0"}
    assert fetched_from_the_index("pip install L9GPU_agent") == {"L9GPU_agent"}
    assert not fetched_from_the_index("pip install '.[all]' && pip install -e '.[test,all]'")
    assert not fetched_from_the_index("pip install 'l9gpu_agent-0.2.0-py3-none-any.whl[all]' dist/*.whl")
    assert not fetched_from_the_index("pip install --target /tmp/peer-site nvitop-exporter==1.7.2")


def test_the_checks_catch_what_does_not_exist(tmp_path):
    """The lookups above refuse made-up names (so a check cannot pass by matching nothing)."""
    fake = "`--no-such-flag` `make nothing` `gpu_no_such_ratio` `GPUNoSuchAlert` `exporter/no_such.py`" \
           " `--set polling.nothing=1`"
    chunks = list(code_of(fake))
    assert "--no-such-flag" in {m.group(1) for c in chunks for m in FLAG.finditer(c)} - known_flags()
    assert "nothing" not in make_targets() and not metric_exists("gpu_no_such_ratio")
    assert "GPUNoSuchAlert" not in alerts() and not value_exists("polling.nothing")
    assert value_exists("polling.interval") and value_exists("serviceMonitor.labels.release")
    assert not path_exists(tmp_path, "exporter/no_such.py") and path_exists(tmp_path, "exporter/app/cli.py")
    assert metric_exists("gpu_up") and "GPUZombieWorkload" in alerts() and "--interval" in known_flags()


# --- the README's snapshot sample ------------------------------------------------------------

SAMPLE_MARK = "<!-- snapshot sample: tests/test_docs.py compares it with the command's output -->"


def normalise(text: str) -> list[str]:
    """Lines with every number as `#` and runs of blanks as one: what moves between passes
    (utilisation, memory, power) and the column padding that follows a number's width."""
    lines = []
    for line in text.splitlines():
        line = re.sub(r"\d+(?:\.\d+)?", "#", line)
        lines.append(re.sub(r"[ \t]+", " ", line).strip())
    return lines


def readme_sample() -> str:
    text = (REPO / "README.md").read_text()
    assert SAMPLE_MARK in text, "README.md lost its snapshot sample"
    match = re.search(r"^```text\n(.*?)^```", text[text.index(SAMPLE_MARK):], re.M | re.S)
    assert match
    return match.group(1)


def test_the_readme_snapshot_sample_is_what_the_simulated_node_prints():
    result = subprocess.run([sys.executable, "-m", "exporter", "snapshot", "--backend", "simulated"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    output = normalise(result.stdout)
    # the sample is pieces of the output, in order, each piece line for line; `…` between them
    pieces = [normalise(piece.strip("\n")) for piece in readme_sample().split("…\n")]
    at = 0
    for piece in pieces:
        starts = [i for i in range(at, len(output) - len(piece) + 1) if output[i:i + len(piece)] == piece]
        assert starts, ("README.md's snapshot sample is not what `l9gpu snapshot --backend simulated` prints:",
                        piece, output)
        at = starts[0] + len(piece)
    assert pieces[0][:2] == output[:2], "the sample starts as the output does (node, header)"
    assert pieces[-1][-1] == output[-1], "the sample ends as the output does"


def test_the_normaliser_keeps_the_layout():
    assert normalise("6    NVIDIA H100  85%   79.0/80.0   606  5") == normalise("6  NVIDIA H100 87%  9.5/80.0 1621 15")
    assert normalise("6 NVIDIA H100 85% 79.0/80.0") != normalise("6 NVIDIA H100 85% 79.0 of 80.0")
    assert normalise("pid 1 python 70.0 GiB sm 0%") != normalise("pid 1 python 70.0 GiB 0%")


def test_every_benchmark_figure_cites_a_results_file_that_exists():
    cited: set[str] = set()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert "no results file" not in text.lower(), f"{doc.name} has a figure without its raw output"
        cited |= set(re.findall(r"benchmarks/results/[\w.\-]+\.(?:txt|json)", text))
    assert cited, "the docs cite no results file at all"
    missing = sorted(path for path in cited if not (REPO / path).is_file())
    assert not missing, f"results files the docs cite but the checkout lacks: {missing}"
