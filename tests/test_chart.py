"""The Helm chart, the plain Kubernetes manifest and the systemd unit.

The chart is rendered by Helm's own Go engine (PyPI ``helm-python-sdk``: the same code as
``helm install``, values.schema.json included), every rendered object is validated
strictly against the Kubernetes API schemas of the oldest Kubernetes the chart supports
and the newest one ``kubernetes-validate`` knows, and the DaemonSet's arguments go through
the real ``l9gpu serve`` argument parser.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
from functools import cache
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from agent import run_cli

helm = pytest.importorskip("helm_python", reason="helm-python-sdk renders the chart (pip install '.[test]' in l9gpu's checkout)")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate checks rendered objects")

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "l9gpu"
MANIFEST = REPO / "deploy" / "kubernetes" / "l9gpu-daemonset.yaml"
UNIT = REPO / "deploy" / "systemd" / "l9gpu.service"

# The install command users are given (README.md and the chart's README lead with it).
INSTALL_COMMAND = """\
helm install l9gpu l9gpu/l9gpu -n l9gpu \\
  --set image.repository=REGISTRY/l9gpu \\
  --set otlp.endpoint="otel-collector.monitoring.svc.cluster.local:4317" \\
  --set otlp.insecure=true \\
  --set polling.interval="2s\""""

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest whose
# API schemas kubernetes-validate ships.
OLDEST_KUBERNETES = "1.25"
KUBERNETES_VERSIONS = (OLDEST_KUBERNETES, kubernetes_validate.latest_version())

FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")


# --- rendering ---------------------------------------------------------------------------

@cache
def _chart(path: Path = CHART) -> Any:
    return helm.Chart.load(path)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Later --set expressions win key by key, as `helm install --set a --set b` does."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _sets(*expressions: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for expression in expressions:
        _merge(values, helm.parse_set_string(expression))
    return values


class Release:
    """The objects one `helm install` would create, by kind and name."""

    def __init__(self, manifests: dict[str, str]):
        self.notes = manifests.pop("l9gpu/templates/NOTES.txt", "")
        self.objects: list[dict[str, Any]] = []
        for text in manifests.values():
            self.objects += [doc for doc in yaml.safe_load_all(text) if doc]

    def kinds(self) -> list[str]:
        return sorted(obj["kind"] for obj in self.objects)

    def one(self, kind: str) -> dict[str, Any]:
        (found,) = [obj for obj in self.objects if obj["kind"] == kind]
        return found

    def has(self, kind: str) -> bool:
        return any(obj["kind"] == kind for obj in self.objects)

    @property
    def pod(self) -> dict[str, Any]:
        return self.one("DaemonSet")["spec"]["template"]["spec"]

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.pod["containers"]
        return container

    def env(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.container["env"]}

    def mounts(self) -> dict[str, dict[str, Any]]:
        return {m["name"]: m for m in self.container.get("volumeMounts", [])}

    def volumes(self) -> dict[str, dict[str, Any]]:
        return {v["name"]: v for v in self.pod.get("volumes", [])}


# No image is published: every install names one (the plain manifest's placeholder here).
REPOSITORY = "REGISTRY/l9gpu"


def render(values: dict[str, Any] | None = None, *, name: str = "l9gpu", namespace: str = "monitoring",
           chart: Path = CHART, image: bool = True) -> Release:
    """The chart rendered with ``values``, and with ``image`` an image repository where
    they set none (the chart refuses to render without one)."""
    values = copy.deepcopy(values or {})
    if image and not (values.get("image") or {}).get("repository"):
        values = _merge({"image": {"repository": REPOSITORY}}, values)
    return Release(_chart(chart).render(values, name=name, namespace=namespace, is_install=True))


def _install_command(text: str) -> tuple[str, str, str, dict[str, Any]]:
    """Release name, chart, namespace and values of a `helm install` command line."""
    words = shlex.split(text.replace("\\\n", " "))  # a backslash-newline continues the line
    assert words[:2] == ["helm", "install"], words
    positional, sets, namespace = [], [], "default"
    rest = iter(words[2:])
    for word in rest:
        if word in ("-n", "--namespace"):
            namespace = next(rest)
        elif word == "--set":
            sets.append(next(rest))
        elif word.startswith("--set="):
            sets.append(word.removeprefix("--set="))
        else:
            assert not word.startswith("-"), f"unexpected flag {word} in the install command"
            positional.append(word)
    release, chart = positional
    return release, chart, namespace, _sets(*sets)


def _first_shell_block(markdown: Path) -> str:
    match = re.search(r"^```sh\n(.*?)^```", markdown.read_text(), re.M | re.S)
    assert match, f"{markdown} has no sh block"
    return match.group(1).strip()


# --- the DaemonSet's arguments through the real parser ---------------------------------

def serve_args(release: Release) -> Any:
    """The container's arguments as `l9gpu serve` parses them (the image's entrypoint is l9gpu)."""
    from exporter.app.cli import build_parser
    from exporter.app.errors import UsageError

    args = release.container["args"]
    assert args[0] == "serve", args
    try:
        parsed = build_parser().parse_args(args)
    except (UsageError, SystemExit) as exc:  # pragma: no cover - the failure is the message
        pytest.fail(f"l9gpu serve refuses the chart's arguments {args}: {exc}")
    from exporter.devices import known_backends

    for backend in parsed.backend.split(","):
        assert backend == "auto" or backend in known_backends(), backend
    return parsed


# --- strict Kubernetes validation -------------------------------------------------------

def _camel_to_snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


# ServiceMonitor endpoint fields the chart sets, and the scrape config key prometheus-operator
# turns each into (None: no counterpart in a scrape config).
_ENDPOINT_TO_SCRAPE = {"port": None, "path": "metrics_path", "interval": "scrape_interval",
                       "scrapeTimeout": "scrape_timeout", "scheme": "scheme", "honorLabels": "honor_labels",
                       "tlsConfig": "tls_config", "basicAuth": "basic_auth", "relabelings": "relabel_configs"}


def _scrape_config(monitor: dict[str, Any]) -> dict[str, Any]:
    """The Prometheus scrape config a ServiceMonitor stands for (one endpoint)."""
    spec = monitor["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints"}, set(spec)
    (endpoint,) = spec["endpoints"]
    unknown = set(endpoint) - set(_ENDPOINT_TO_SCRAPE)
    assert not unknown, f"ServiceMonitor endpoint fields the test does not know: {unknown}"
    config: dict[str, Any] = {
        "job_name": f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0",
        # Debian's promtool has no Kubernetes discovery; the target list does not matter here
        "static_configs": [{"targets": ["gpu-node-1:9835"]}]}
    for field, value in endpoint.items():
        key = _ENDPOINT_TO_SCRAPE[field]
        if key == "relabel_configs":
            value = [{_camel_to_snake(k): v for k, v in rule.items()} for rule in value]
        elif key == "tls_config":  # SafeTLSConfig: only the fields that need no Secret translate
            value = {_camel_to_snake(k): v for k, v in value.items() if k in ("insecureSkipVerify", "serverName")}
        elif key == "basic_auth":  # Secret references: the Secret's content is not known here
            value = {"username": "user", "password": "password"}
        if key:
            config[key] = value
    return config


# PodMonitor endpoint fields the chart sets, and their scrape config keys.
_POD_ENDPOINT_TO_SCRAPE = {"port": None, "path": "metrics_path", "interval": "scrape_interval",
                           "honorLabels": "honor_labels", "relabelings": "relabel_configs"}


def _pod_scrape_configs(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """The Prometheus scrape configs a PodMonitor stands for (one per endpoint)."""
    spec = monitor["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "podMetricsEndpoints"}, set(spec)
    configs = []
    for i, endpoint in enumerate(spec["podMetricsEndpoints"]):
        unknown = set(endpoint) - set(_POD_ENDPOINT_TO_SCRAPE)
        assert not unknown, f"PodMonitor endpoint fields the test does not know: {unknown}"
        config: dict[str, Any] = {
            "job_name": f"podMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/{i}",
            "static_configs": [{"targets": ["vllm-0:8000"]}]}
        for field, value in endpoint.items():
            key = _POD_ENDPOINT_TO_SCRAPE[field]
            if key == "relabel_configs":
                value = [{_camel_to_snake(k): v for k, v in rule.items()} for rule in value]
            if key:
                config[key] = value
        configs.append(config)
    return configs


def validate_custom_resources(release: Release, tmp_path: Path) -> None:
    """ServiceMonitor, PodMonitor and PrometheusRule, which kubernetes-validate does not know,
    go through the real Prometheus: the rules through `promtool check rules`, the monitors as
    the scrape configs they stand for through `promtool check config`."""
    from conftest import need_tool

    promtool = need_tool("promtool")
    checks = []
    for obj in release.objects:
        if obj["kind"] == "PrometheusRule":
            assert set(obj["spec"]) == {"groups"}
            rules = tmp_path / f"{obj['metadata']['name']}.rules.yaml"
            rules.write_text(yaml.safe_dump(obj["spec"]))
            checks.append([promtool, "check", "rules", str(rules)])
        elif obj["kind"] in ("ServiceMonitor", "PodMonitor"):
            config = tmp_path / f"{obj['metadata']['name']}.prometheus.yml"
            jobs = [_scrape_config(obj)] if obj["kind"] == "ServiceMonitor" else _pod_scrape_configs(obj)
            config.write_text(yaml.safe_dump({"scrape_configs": jobs}))
            checks.append([promtool, "check", "config", "--syntax-only", str(config)])
    for check in checks:
        result = subprocess.run(check, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def validate_objects(release: Release, tmp_path: Path) -> list[str]:
    """Validate every object for each Kubernetes version; returns the versions checked."""
    checked = []
    for version in KUBERNETES_VERSIONS:
        for obj in release.objects:
            label = f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}"
            if obj["apiVersion"] == "monitoring.coreos.com/v1":
                # kubernetes-validate knows no custom resources: their metadata is checked as
                # any object's here, their spec by Prometheus below
                obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{label}: {where}: {exc.message}")
        checked.append(version)
    validate_custom_resources(release, tmp_path)
    return checked


# --- the cases the chart is rendered with ----------------------------------------------

def _documented() -> tuple[dict[str, Any], str, str]:
    release, chart, namespace, values = _install_command(INSTALL_COMMAND)
    assert (release, chart, namespace) == ("l9gpu", "l9gpu/l9gpu", "l9gpu")
    return values, release, namespace


CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "documented install command": _documented()[0],
    "OTLP over http/protobuf with a headers Secret and a CA": _sets(
        "otlp.endpoint=https://otlp.example.com:4318", "otlp.protocol=http/protobuf",
        "otlp.headers.secretName=otlp-auth", "otlp.caSecret.secretName=otlp-ca",
        "otlp.interval=30s", "otlp.timeout=5s"),
    "webConfig with TLS": _sets(
        "webConfig.secretName=l9gpu-web", "webConfig.tls=true", "serviceMonitor.enabled=true",
        "serviceMonitor.tlsConfig.insecureSkipVerify=true"),
    "ServiceMonitor, PrometheusRule and Grafana dashboards": _sets(
        "serviceMonitor.enabled=true", "serviceMonitor.labels.release=kube-prometheus-stack",
        "prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus-stack",
        "grafanaDashboards.enabled=true", "grafanaDashboards.annotations.grafana_folder=GPU"),
    "PodMonitor for the inference engines": _merge(_sets(
        "inference.podMonitor.enabled=true", "inference.podMonitor.labels.release=kube-prometheus-stack",
        "prometheusRule.enabled=true", "prometheusRule.inferenceRules=false"),
        helm.values_from_yaml("inference: {podMonitor: {namespaces: [ml-prod, search],\n"
                              "  endpoints: [{port: http}, {port: api, path: /v1/metrics}], interval: ''}}\n")),
    "hostPID false with the host's /proc mounted": _sets("hostPID=false"),
    "backend gaudi": _sets("backend=gaudi"),
    "everything else": _merge(_sets(
        "backend=nvml\\,amd", "metricSchema=l9gpu\\,dcgm", "dcgmHostnameLabel=hostname", "podLabels={team,cost-center}",
        "cri.enabled=true",
        "cri.socket=/run/k3s/containerd/containerd.sock", "processMetrics=true", "logLevel=debug",
        "detailMetrics={gpu_nvlink_errors_total,gpu_tensor_hmma_active_ratio}",
        "logFormat=text", "extraArgs={--workload-grace,10m,--disable-metric,gpu_info}",
        "hostPort=true", "hostNetwork=true", "image.digest=sha256:" + "0" * 64,
        "imagePullSecrets[0].name=registry", "runtimeClassName=nvidia", "priorityClassName=",
        "serviceAccount.create=false", "serviceAccount.name=gpu-agent", "rbac.create=false",
        "service.enabled=false", "podResources.enabled=false", "nvidia.visibleDevicesAll=false",
        "gpuNodeAffinity.enabled=false", "nodeSelector.gpu=true", "podAnnotations.team=ml",
        "podMetadataLabels.tier=monitoring", "updateStrategy.type=OnDelete", "updateStrategy.rollingUpdate=null",
        "podSecurityContext.fsGroup=0"),
        # a values file's bare `off` is YAML's false
        helm.values_from_yaml("kubernetesApi: off\nextraEnv: [{name: L9GPU_WORKLOAD_GRACE, value: 10m}]\n"
                              "nodeSelector: {gpu: 'true'}\n"
                              "livenessProbe: {tcpSocket: {port: metrics}, periodSeconds: 10}\n")),
}


@pytest.fixture(scope="module")
def releases() -> dict[str, Release]:
    return {case: render(values, namespace="monitoring") for case, values in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_every_case_renders_valid_kubernetes_objects_and_arguments_the_agent_accepts(case, releases, tmp_path):
    release = releases[case]
    assert validate_objects(release, tmp_path) == list(KUBERNETES_VERSIONS)
    serve_args(release)
    for obj in release.objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "monitoring", obj["kind"]


@pytest.mark.parametrize(("value", "expected"), [("5s", 5.0), ("500ms", 0.5), ("0", 0.0), ("off", None)])
def test_gpm_interval_reaches_the_agent(value, expected):
    release = render(_sets(f"polling.gpmInterval={value}"))
    assert serve_args(release).gpm_interval == expected


def test_read_timeout_reaches_the_agent():
    assert serve_args(render(_sets("polling.readTimeout=3s"))).read_timeout == 3.0
    assert serve_args(render(_sets())).read_timeout == 1.0


@pytest.mark.parametrize(("schema", "label", "served"), [
    ("dcgm", "Hostname", "Hostname"),
    ("dcgm", "hostname", "hostname"),
    ("l9gpu\\,dcgm", "none", "none"),
    ("l9gpu", "hostname", None),  # no DCGM schema: the flag is not passed (the agent would refuse it)
])
def test_the_dcgm_node_label_reaches_the_agent(schema, label, served):
    from exporter.app.wiring import select_dcgm_fields

    args = serve_args(render(_sets(f"metricSchema={schema}", f"dcgmHostnameLabel={label}")))
    selection = select_dcgm_fields(args)  # what `l9gpu serve` makes of the flags: no usage error
    assert (selection.hostname_label if selection else None) == served


def test_http_limits_reach_the_agent():
    args = serve_args(render(_sets("http.maxConnections=64", "http.keepaliveTimeout=30s", "http.headerTimeout=5s")))
    assert (args.max_connections, args.keepalive_timeout, args.header_timeout) == (64, 30.0, 5.0)
    defaults = serve_args(render())
    assert (defaults.max_connections, defaults.keepalive_timeout, defaults.header_timeout) == (512, 75.0, 10.0)


def test_the_documented_install_command_sets_every_value_it_names():
    values, name, namespace = _documented()
    release = render(values, name=name, namespace=namespace)
    args = serve_args(release)
    assert args.interval == 2.0, release.container["args"]
    assert "--interval=2s" in release.container["args"]
    assert args.otlp_endpoint == "otel-collector.monitoring.svc.cluster.local:4317"
    assert args.otlp_insecure is True and args.otlp_protocol == "grpc"
    assert "collects every 2s" in release.notes
    assert "OTLP: pushing to otel-collector.monitoring.svc.cluster.local:4317 over grpc (plaintext) every 60s" \
        in release.notes
    metadata = release.one("DaemonSet")["metadata"]
    assert (metadata["name"], metadata["namespace"]) == ("l9gpu", "l9gpu")


def test_the_readmes_lead_with_the_install_command():
    for readme in (REPO / "README.md", CHART / "README.md"):
        assert _first_shell_block(readme) == INSTALL_COMMAND, readme
        # the block as written (shell quoting, line continuations) renders as documented
        release = render(_install_command(_first_shell_block(readme))[3])
        assert serve_args(release).interval == 2.0


def test_defaults():
    release = render()
    assert release.kinds() == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service", "ServiceAccount"]
    args = serve_args(release)
    assert (args.backend, args.interval, args.listen, args.kubernetes) == ("auto", 1.0, ("0.0.0.0", 9835), "auto")
    assert args.proc_root == "/proc" and args.otlp_endpoint is None and args.web_config is None
    assert args.metric_schema == ("l9gpu",)
    assert not any(a.startswith("--metric-schema") for a in release.container["args"])
    assert serve_args(render(_sets("metricSchema=dcgm"))).metric_schema == ("dcgm",)
    assert not any(a.startswith("--dcgm-hostname-label") for a in render(_sets("metricSchema=dcgm")).container["args"])
    pod = release.pod
    assert pod["hostPID"] is True and pod["serviceAccountName"] == "l9gpu"
    assert "capabilities" not in release.container["securityContext"] or \
        "add" not in release.container["securityContext"]["capabilities"]
    assert release.container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert release.container["image"] == f"{REPOSITORY}:{_chart().metadata['appVersion']}"
    assert release.env()["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert release.mounts()["pod-resources"] == {"name": "pod-resources", "readOnly": True,
                                                 "mountPath": "/var/lib/kubelet/pod-resources"}
    assert "host-proc" not in release.volumes()
    service = release.one("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= release.one("DaemonSet")["spec"]["template"]["metadata"][
        "labels"].items()
    role = release.one("ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                             {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                             {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert "kmsg" not in release.volumes() and "kmsg" not in release.mounts()
    assert not any(a.startswith("--kubernetes-events") for a in release.container["args"])
    assert "port-forward ds/l9gpu 9835" in release.notes
    # the page of one node: the pod selector in the hint is the DaemonSet's own
    selector = release.one("DaemonSet")["spec"]["selector"]["matchLabels"]
    hint = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    assert f"-l {hint} --field-selector spec.nodeName=NODE) 9835" in release.notes
    assert "open http://localhost:9835/" in release.notes


def test_otlp_over_http_with_headers_secret_and_ca(releases):
    release = releases["OTLP over http/protobuf with a headers Secret and a CA"]
    args = serve_args(release)
    assert args.otlp_endpoint == "https://otlp.example.com:4318" and args.otlp_protocol == "http/protobuf"
    assert args.otlp_interval == 30.0 and args.otlp_timeout == 5.0 and not args.otlp_insecure
    assert release.env()["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"] == {
        "secretKeyRef": {"name": "otlp-auth", "key": "headers"}}
    # the CA file the agent is given is the Secret's key, where the Secret is mounted
    mount = release.mounts()["otlp-ca"]
    assert args.otlp_certificate == f"{mount['mountPath']}/ca.crt" and mount["readOnly"] is True
    assert release.volumes()["otlp-ca"]["secret"] == {"secretName": "otlp-ca"}
    # no endpoint, no push: the headers and the CA are not wired either
    quiet = render(_sets("otlp.headers.secretName=otlp-auth", "otlp.caSecret.secretName=otlp-ca"))
    assert serve_args(quiet).otlp_endpoint is None
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in quiet.env() and "otlp-ca" not in quiet.volumes()


def test_web_config_with_tls(releases):
    release = releases["webConfig with TLS"]
    args = serve_args(release)
    mount = release.mounts()["web-config"]
    assert args.web_config == f"{mount['mountPath']}/web-config.yml" and mount["readOnly"] is True
    assert release.volumes()["web-config"]["secret"] == {"secretName": "l9gpu-web"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert release.container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    (endpoint,) = release.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # without tls: the same Secret, plain HTTP probes
    plain = render(_sets("webConfig.secretName=l9gpu-web"))
    assert "scheme" not in plain.container["livenessProbe"]["httpGet"]


def test_monitoring_objects(releases):
    release = releases["ServiceMonitor, PrometheusRule and Grafana dashboards"]
    monitor = release.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= release.one("Service")["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["monitoring"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == release.one("Service")["spec"]["ports"][0]["name"] == "metrics"
    assert endpoint["honorLabels"] is True and (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    # empty durations leave the choice to Prometheus
    (endpoint,) = render(_sets("serviceMonitor.enabled=true", "serviceMonitor.interval=",
                               "serviceMonitor.scrapeTimeout=")).one("ServiceMonitor")["spec"]["endpoints"]
    assert "interval" not in endpoint and "scrapeTimeout" not in endpoint
    rule = release.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # the chart's rules, then the inference, chargeback and training rules (on by default)
    groups = [yaml.safe_load((REPO / "alerts" / name).read_text())["groups"]
              for name in ("l9gpu.rules.yaml", "l9gpu-inference.rules.yaml", "l9gpu-chargeback.rules.yaml",
                           "l9gpu-training.rules.yaml")]
    assert rule["spec"] == {"groups": groups[0] + groups[1] + groups[2] + groups[3]}
    assert not release.has("PodMonitor")
    dashboards = release.one("ConfigMap")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    source = {p.name: json.loads(p.read_text()) for p in (REPO / "dashboards").glob("*.json")}
    assert {name: json.loads(text) for name, text in dashboards["data"].items()} == source


def test_inference_pod_monitor(releases):
    """Off by default; on, it scrapes the selected engine pods on each endpoint, keeps the
    engines' own labels and names TGI's model from the pod's l9gpu.io/model label."""
    assert not releases["defaults"].has("PodMonitor")
    release = releases["PodMonitor for the inference engines"]
    monitor = release.one("PodMonitor")
    assert monitor["metadata"]["name"] == "l9gpu-inference"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["selector"] == {"matchLabels": {"l9gpu.io/inference": "true"}}
    assert spec["namespaceSelector"] == {"matchNames": ["ml-prod", "search"]}
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_label_l9gpu_io_model"], "regex": "(.+)",
                "targetLabel": "model_name"}]
    assert spec["podMetricsEndpoints"] == [
        {"port": "http", "path": "/metrics", "honorLabels": True, "relabelings": relabel},
        {"port": "api", "path": "/v1/metrics", "honorLabels": True, "relabelings": relabel}]
    # without the inference rules, the chart's own, the chargeback and the training rules
    rule = release.one("PrometheusRule")
    assert rule["spec"] == {"groups": [*yaml.safe_load((REPO / "alerts" / "l9gpu.rules.yaml").read_text())["groups"],
                                       *yaml.safe_load((REPO / "alerts" / "l9gpu-chargeback.rules.yaml").read_text())
                                       ["groups"],
                                       *yaml.safe_load((REPO / "alerts" / "l9gpu-training.rules.yaml").read_text())
                                       ["groups"]]}
    defaults = render(_sets("inference.podMonitor.enabled=true", "inference.podMonitor.modelLabel="))
    (endpoint,) = defaults.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "http", "path": "/metrics", "interval": "15s", "honorLabels": True}
    assert defaults.one("PodMonitor")["spec"]["namespaceSelector"] == {"any": True}


def test_training_rules_can_be_left_out():
    """prometheusRule.trainingRules=false: the rule groups of alerts/l9gpu-training.rules.yaml are
    not in the PrometheusRule, the others are."""
    names = {group["name"] for group in yaml.safe_load((REPO / "alerts" / "l9gpu-training.rules.yaml").read_text())
             ["groups"]}
    assert names == {"l9gpu-training", "l9gpu-training-hourly"}
    on = render(_sets("prometheusRule.enabled=true")).one("PrometheusRule")["spec"]["groups"]
    off = render(_sets("prometheusRule.enabled=true", "prometheusRule.trainingRules=false")).one(
        "PrometheusRule")["spec"]["groups"]
    assert names <= {group["name"] for group in on}
    assert [group for group in on if group["name"] not in names] == off


def test_host_proc_mount_without_host_pid(releases):
    release = releases["hostPID false with the host's /proc mounted"]
    args = serve_args(release)
    assert release.pod["hostPID"] is False
    mount = release.mounts()["host-proc"]
    assert args.proc_root == mount["mountPath"] == "/host/proc" and mount["readOnly"] is True
    assert release.volumes()["host-proc"]["hostPath"] == {"path": "/proc", "type": "Directory"}


def test_capabilities_only_where_a_backend_needs_them(releases):
    gaudi = releases["backend gaudi"]
    assert serve_args(gaudi).backend == "gaudi"
    assert gaudi.container["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                                 "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    for case, release in releases.items():
        if "gaudi" not in serve_args(release).backend:
            assert "add" not in release.container["securityContext"].get("capabilities", {}), case
    # a mixed node, and capabilities of the user's own are kept
    mixed = render(_sets("backend=nvml\\,gaudi", "securityContext.capabilities.add={NET_RAW}"))
    assert mixed.container["securityContext"]["capabilities"]["add"] == ["NET_RAW", "SYS_PTRACE", "DAC_READ_SEARCH"]
    readme = (CHART / "README.md").read_text()
    assert "SYS_PTRACE" in readme and "/proc/<pid>/fd" in readme


# The agent's flags for these two (the kernel log's path, Events off) come with the
# incidents work in exporter/app/cli.py; until then their renders are checked here without the
# argument parser, and join CASES (and serve_args) when it knows them.

def test_by_default_the_kernel_log_is_read_from_the_hosts_journal_unprivileged(tmp_path):
    release = render()
    validate_objects(release, tmp_path)
    assert "--kernel-log=journal" in release.container["args"]
    assert serve_args(release).kernel_log == "journal"
    assert release.mounts()["journal-persistent"] == {"name": "journal-persistent", "mountPath": "/var/log/journal",
                                                      "readOnly": True}
    assert release.mounts()["journal-volatile"] == {"name": "journal-volatile", "mountPath": "/run/log/journal",
                                                    "readOnly": True}
    assert release.volumes()["journal-persistent"]["hostPath"] == {"path": "/var/log/journal", "type": "Directory"}
    assert release.volumes()["journal-volatile"]["hostPath"] == {"path": "/run/log/journal", "type": "Directory"}
    # the host's machine id, so that another machine's journal entries name no local process
    assert release.mounts()["machine-id"] == {"name": "machine-id", "mountPath": "/etc/machine-id", "readOnly": True}
    assert release.volumes()["machine-id"]["hostPath"] == {"path": "/etc/machine-id", "type": "File"}
    context = release.container["securityContext"]
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    # a node setup with only a volatile journal
    volatile = render(_sets("kernelLog.journal.persistent=false"))
    assert "journal-persistent" not in volatile.volumes() and "journal-volatile" in volatile.mounts()
    off = render(_sets("kernelLog.enabled=false"))
    assert not any(a.startswith("--kernel-log") for a in off.container["args"])
    assert not {"journal-persistent", "journal-volatile", "kmsg", "machine-id"} & set(off.volumes())


def test_kernel_log_mounts_the_hosts_kmsg_with_cap_syslog_in_a_privileged_container(tmp_path):
    release = render(_sets("kernelLog.source=kmsg"))
    validate_objects(release, tmp_path)
    assert "--kernel-log=/dev/kmsg" in release.container["args"]
    assert release.mounts()["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    assert release.volumes()["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    context = release.container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    # the device cgroup admits a mounted device only to a privileged container, which the
    # API server accepts only with privilege escalation allowed
    assert context["privileged"] is True and context["allowPrivilegeEscalation"] is True
    # not privileged where the runtime admits /dev/kmsg; the other capabilities kept
    plain = render(_sets("kernelLog.source=kmsg", "kernelLog.privileged=false", "backend=nvml\\,gaudi"))
    validate_objects(plain, tmp_path)
    context = plain.container["securityContext"]
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["add"] == ["SYS_PTRACE", "DAC_READ_SEARCH", "SYSLOG"]
    assert plain.mounts()["kmsg"]["readOnly"] is True
    # from the journal (the default): never privileged
    assert render(_sets("kernelLog.privileged=true")).container["securityContext"]["privileged"] is False
    assert "journal-persistent" not in release.volumes()


def test_events_need_create_and_patch_on_events_and_can_be_turned_off(tmp_path):
    events_rule = {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}
    assert events_rule in render().one("ClusterRole")["rules"]
    off = render(_sets("events.enabled=false", "health.nodeCondition=false"))
    validate_objects(off, tmp_path)
    assert off.one("ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert "--kubernetes-events=off" in off.container["args"]
    assert not render(_sets("rbac.create=false")).has("ClusterRole")


def test_stall_after_is_passed_only_when_it_is_not_the_agents_default(tmp_path):
    assert not any(a.startswith("--stall-after") for a in render().container["args"])
    for value in ("90s", "off"):
        shorter = render(_sets(f"stall.after={value}"))
        validate_objects(shorter, tmp_path)
        assert f"--stall-after={value}" in shorter.container["args"]


NODE_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
              {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]


def test_the_node_condition_needs_get_on_nodes_and_patch_on_nodes_status_only(tmp_path):
    default = render()
    assert default.one("ClusterRole")["rules"][-2:] == NODE_RULES
    assert not any(a.startswith("--node-") for a in default.container["args"])  # the agent's defaults
    off = render(_sets("health.nodeCondition=false"))
    validate_objects(off, tmp_path)
    assert not any("nodes" in rule["resources"] or "nodes/status" in rule["resources"]
                   for rule in off.one("ClusterRole")["rules"])
    assert "--node-condition=off" in off.container["args"]
    typed = render(_sets("health.conditionType=example.com/GPUProblem"))
    assert "--node-condition-type=example.com/GPUProblem" in typed.container["args"]


@pytest.mark.parametrize("taint", ["off", "false"])
def test_the_taint_is_off_by_default_and_off_means_off(taint):
    release = render(_sets(f"health.taint={taint}"))
    assert release.one("ClusterRole")["rules"][-2:] == NODE_RULES
    assert not any(a.startswith("--node-taint") for a in release.container["args"])


def test_the_taint_adds_patch_on_nodes(tmp_path):
    tainted = render(_sets("health.taint=unhealthy"))
    validate_objects(tainted, tmp_path)
    assert tainted.one("ClusterRole")["rules"][-2:] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert tainted.container["args"][-2:] == ["--node-taint=unhealthy", "--node-taint-key=l9gpu.io/gpu-unhealthy"]
    keyed = render(_sets("health.taint=unhealthy", "health.taintKey=example.com/gpu"))
    assert "--node-taint-key=example.com/gpu" in keyed.container["args"]
    for bad in ("health.taint=always", "health.conditionType=gpu unhealthy"):
        with pytest.raises(Exception, match="health"):
            render(_sets(bad))


def test_everything_else(releases):
    release = releases["everything else"]
    args = serve_args(release)
    assert args.backend == "nvml,amd" and args.pod_label == ["team", "cost-center"]
    assert args.metric_schema == ("l9gpu", "dcgm") and args.dcgm_hostname_label == "hostname"
    assert args.kubernetes == "off" and args.process_metrics and args.log_level == "debug"
    assert args.workload_grace == 600.0 and args.disable_metric == ["gpu_info"]
    assert args.cri_socket == release.mounts()["cri-socket"]["mountPath"] == "/run/k3s/containerd/containerd.sock"
    assert release.volumes()["cri-socket"]["hostPath"]["type"] == "Socket"
    assert release.container["image"] == f"{REPOSITORY}@sha256:" + "0" * 64
    pod = release.pod
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert release.container["ports"][0]["hostPort"] == 9835
    assert pod["serviceAccountName"] == "gpu-agent" and "priorityClassName" not in pod
    assert "affinity" not in pod and pod["nodeSelector"] == {"gpu": "true"}
    assert release.env()["L9GPU_WORKLOAD_GRACE"] == {"name": "L9GPU_WORKLOAD_GRACE", "value": "10m"}
    assert "NVIDIA_VISIBLE_DEVICES" not in release.env() and "pod-resources" not in release.volumes()
    # the tcpSocket handler replaces the default httpGet; the default timings stay
    assert release.container["livenessProbe"] == {"tcpSocket": {"port": "metrics"}, "periodSeconds": 10,
                                                  "initialDelaySeconds": 10, "failureThreshold": 3}
    assert release.one("DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert release.kinds() == ["DaemonSet"]
    # a ServiceMonitor without the Service it selects is refused, saying so
    with pytest.raises(helm.HelmRenderError, match="serviceMonitor.enabled needs service.enabled"):
        render(_sets("service.enabled=false", "serviceMonitor.enabled=true"))


# --- values.schema.json ----------------------------------------------------------------

def _schema_error(*expressions: str, values: dict[str, Any] | None = None) -> str:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values if values is not None else _sets(*expressions))
    return str(caught.value)


def test_without_an_image_repository_the_chart_says_how_to_get_one():
    """No l9gpu image is published: a DaemonSet that can never pull is not rendered, the
    chart fails with what to do instead, however the rest is set."""
    for values in ({}, _sets("image.tag=0.2.0"), _documented()[0] | {"image": {"repository": ""}}):
        with pytest.raises(helm.HelmRenderError) as caught:
            render(values, image=False)
        assert "image.repository is not set: no l9gpu image is published" in str(caught.value)
        assert "--set image.repository=REGISTRY/l9gpu" in str(caught.value)
    # the install commands users are given set one
    assert render(_documented()[0], image=False).container["image"] == "REGISTRY/l9gpu:0.2.0"


@pytest.mark.parametrize(("expression", "message"), [
    ("polling.intervall=2s", "additional properties 'intervall' not allowed"),
    ("interval=2s", "additional properties 'interval' not allowed"),
    ("otlp.endpiont=otel:4317", "additional properties 'endpiont' not allowed"),
    ("securityContext.privilgd=true", "additional properties 'privilgd' not allowed"),
    ("tolerations[0].efect=NoSchedule", "additional properties 'efect' not allowed"),
    ("polling.interval=2", "got number, want string"),
    ("polling.interval=2sec", "'2sec' does not match pattern"),
    ("polling.interval=0s", "'0s' does not match pattern"),
    ("polling.gpmInterval=often", "polling/gpmInterval"),
    ("polling.readTimeout=0s", "'0s' does not match pattern"),
    ("otlp.interval=soon", "'soon' does not match pattern"),
    ("otlp.timeout=-1s", "'-1s' does not match pattern"),
    ("serviceMonitor.interval=1.5s", "'1.5s' does not match pattern"),
    ("port=0", "minimum: got 0, want 1"),
    ("http.maxConnections=0", "minimum: got 0, want 1"),
    ("http.keepaliveTimeout=forever", "'forever' does not match pattern"),
    ("http.headerTimout=5s", "additional properties 'headerTimout' not allowed"),
    ("port=65536", "maximum: got 65,536, want 65,535"),
    ("port=metrics", "got string, want integer"),
    ("backend=nvidia", "'nvidia' does not match pattern"),
    ("metricSchema=dcgm-exporter", "'dcgm-exporter' does not match pattern"),
    ("dcgmHostnameLabel=HOSTNAME", "value must be one of 'Hostname', 'hostname', 'none'"),
    ("backend=auto\\,gaudi", "'auto,gaudi' does not match pattern"),
    ("otlp.protocol=http", "value must be one of 'grpc', 'http/protobuf'"),
    ("kubernetesApi=maybe", "value must be one of"),
    ("logLevel=verbose", "value must be one of"),
    ("image.pullPolicy=always", "value must be one of"),
    ("hostPID=yes", "got string, want boolean"),
    ("podLabels={team,team}", "items at 0 and 1 are equal"),
    ("podLabels={not a label}", "does not match pattern"),
    ("kernelLog.enabled=yes", "got string, want boolean"),
    ("kernelLog.privilegd=true", "additional properties 'privilegd' not allowed"),
    ("events.enable=true", "additional properties 'enable' not allowed"),
    ("stall.after=soon", "'soon' does not match pattern"),
    ("cri.socket=run/crio/crio.sock", "does not match pattern"),
    ("resources.limits.memory=lots", "'lots' does not match pattern"),
])
def test_schema_refuses_with_a_message_naming_the_key(expression, message):
    error = _schema_error(expression)
    assert message in error, error
    key = expression.split("=", 1)[0].split("[")[0]
    path = "/" + key.replace(".", "/")
    parent = path.rsplit("/", 1)[0]
    # Helm names the value (or, for an unknown key, its parent and the key itself)
    assert f"at '{path}" in error or f"at '{parent}'" in error, error


def test_schema_accepts_every_case_and_values_file_forms():
    for values in CASES.values():
        _chart().validate_schema(values)
    # YAML's bare on/off, and numbers where Kubernetes takes them
    _chart().validate_schema(helm.values_from_yaml(
        "kubernetesApi: on\nimage: {tag: 2}\nresources: {limits: {cpu: 1, memory: 1Gi}}\n"
        "updateStrategy: {rollingUpdate: {maxUnavailable: 1}}\n"))
    assert serve_args(render(helm.values_from_yaml("kubernetesApi: on"))).kubernetes == "on"


def _schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _walk(schema: dict[str, Any], node: dict[str, Any], values: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, schema node) for each value in values.yaml, following the schema."""
    node = _resolve(schema, node)
    yield path, node
    if isinstance(values, dict) and "properties" in node:
        for key, sub in values.items():
            assert key in node["properties"], f"{path}.{key} is in values.yaml but not in values.schema.json"
            yield from _walk(schema, node["properties"][key], sub, f"{path}.{key}".lstrip("."))


def test_schema_describes_every_value_and_values_yaml_shows_every_key():
    schema = _schema()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False and set(schema["properties"]) == set(values)
    for key, node in schema["properties"].items():
        assert node.get("description"), f"{key} has no description in values.schema.json"
        target = _resolve(schema, node)
        if target.get("type") == "object" and "properties" in target and isinstance(values[key], dict):
            # the chart's own groups show every key in values.yaml; Kubernetes types need not
            if "$ref" not in node:
                assert set(target["properties"]) == set(values[key]), key
    for path, node in _walk(schema, schema, values):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"


def test_schema_mirrors_kubernetes_types():
    """Definitions named after a Kubernetes type allow only that type's fields."""
    from kubernetes_validate.utils import schema_contents

    latest = kubernetes_validate.latest_version()
    known = schema_contents(f"kubernetes-json-schema/v{latest}-local-strict/_definitions.json", latest)["$defs"]
    mirrored = 0
    for name, definition in _schema()["definitions"].items():
        if not name[0].isupper():
            continue
        candidates = [k for k in known if k.rsplit(".", 1)[1] == name and k.startswith("io.k8s.api.")]
        assert candidates, f"{name} is not a Kubernetes type"
        fields = set(known[candidates[0]]["properties"])
        assert set(definition["properties"]) <= fields, (name, set(definition["properties"]) - fields)
        assert definition["additionalProperties"] is False
        mirrored += 1
    assert mirrored >= 10


# Durations: what the schema accepts, the agent accepts.
_UNITS = ("ms", "s", "m", "h")


def test_schema_durations_agree_with_the_agent():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    from exporter.core.parsing import parse_positive_duration

    number = st.from_regex(r"\A(0|[0-9]{1,3})(\.[0-9]{1,2})?\Z")
    component = st.tuples(number, st.sampled_from(_UNITS)).map("".join)
    well_formed = st.lists(component, min_size=1, max_size=3).map("".join)
    junk = st.text(alphabet="0123456789.smh -+eµx", max_size=8)

    def agent_accepts(text: str) -> bool:
        try:
            return parse_positive_duration(text) > 0
        except ValueError:
            return False

    def schema_accepts(text: str) -> bool:
        try:
            _chart().validate_schema({"polling": {"interval": text}})
        except helm.HelmValuesError:
            return False
        return True

    @hypothesis.settings(max_examples=300, deadline=None, database=None)
    @hypothesis.given(well_formed)
    def with_units(text: str) -> None:
        assert schema_accepts(text) == agent_accepts(text), text

    @hypothesis.settings(max_examples=300, deadline=None, database=None)
    @hypothesis.given(junk)
    def anything(text: str) -> None:
        if schema_accepts(text):
            assert agent_accepts(text), text

    with_units()
    anything()


# --- lint, package, repository ---------------------------------------------------------

def test_helm_lint_strict():
    report = helm.lint(CHART, strict=True, namespace="monitoring")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report
    for values in CASES.values():
        report = helm.lint(CHART, values, strict=True)
        assert not [m for m in report["messages"] if m["severity"] >= 2], report


def test_chart_metadata():
    meta = _chart().metadata
    from exporter import __version__

    assert meta["apiVersion"] == "v2" and meta["name"] == "l9gpu" and meta["type"] == "application"
    assert meta["appVersion"] == __version__
    assert meta["kubeVersion"] == f">={OLDEST_KUBERNETES}.0-0"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


# `helm repo add` + `helm pull` in a process of their own: Helm's Go runtime reads
# HELM_*_HOME from the environment the process started with, and a pull writes its cache.
_PULL = """
import json, sys, helm_python
url, dest = sys.argv[1:]
index = helm_python.repo_index(url)
helm_python.pull("l9gpu", repo_url=url, destination=dest)
print(json.dumps([entry["version"] for entry in index["entries"]["l9gpu"]]))
"""


def test_make_chart_packages_a_repository_helm_can_install_from(tmp_path):
    """`make chart`'s command, then what `helm repo add` + `helm install l9gpu/l9gpu` do."""
    repo = tmp_path / "charts"
    result = subprocess.run([sys.executable, str(REPO / "charts" / "package.py"), str(repo)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    version = _chart().metadata["version"]
    archive = repo / f"l9gpu-{version}.tgz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for name in ("Chart.yaml", "values.yaml", "values.schema.json", "README.md", "templates/daemonset.yaml",
                 "files/l9gpu.rules.yaml", "files/l9gpu-inference.rules.yaml", "templates/podmonitor.yaml",
                 "dashboards/l9gpu-workloads.json"):
        assert f"l9gpu/{name}" in names, name
    index = yaml.safe_load((repo / "index.yaml").read_text())
    (entry,) = index["entries"]["l9gpu"]
    assert entry["version"] == version and entry["urls"] == [archive.name]
    assert "sha256:" + entry["digest"] == helm.digest(archive)

    values, name, namespace = _documented()
    from_directory = render(values, name=name, namespace=namespace)
    from_archive = render(values, name=name, namespace=namespace, chart=archive)
    assert from_archive.objects == from_directory.objects
    with pytest.raises(helm.HelmValuesError, match="intervall"):
        render(_sets("polling.intervall=2s"), chart=archive)

    # serve the folder as a static Helm repository on loopback
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _QuietHandler(*a, directory=str(repo)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    pulled = tmp_path / "pulled"
    pulled.mkdir()
    env = {**os.environ, **{f"HELM_{home}_HOME": str(tmp_path / "helm" / home.lower())
                            for home in ("CACHE", "CONFIG", "DATA")}}
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = subprocess.run([sys.executable, "-c", _PULL, url, str(pulled)], capture_output=True, text=True,
                                env=env, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [version]
    (downloaded,) = pulled.glob("l9gpu-*.tgz")
    assert downloaded.read_bytes() == archive.read_bytes()
    release = render(values, name=name, namespace=namespace, chart=downloaded)
    assert serve_args(release).interval == 2.0
    assert validate_objects(release, tmp_path) == list(KUBERNETES_VERSIONS)


def test_package_reports_lint_problems(tmp_path):
    broken = tmp_path / "l9gpu"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "daemonset.yaml").write_text("{{ .Values.polling.interval | nosuchfunc }}\n")
    sys.path.insert(0, str(REPO / "charts"))
    try:
        from package import PackagingError, package_chart
    finally:
        sys.path.remove(str(REPO / "charts"))
    with pytest.raises(PackagingError, match="helm lint"):
        package_chart(tmp_path / "out", chart=broken)
    assert not (tmp_path / "out").exists()


def test_gitignore_keeps_dist_out():
    assert "dist/" in (REPO / ".gitignore").read_text().splitlines()


# --- copies the chart ships ------------------------------------------------------------

def test_rules_copy_matches_the_alerts_file():
    for name in ("l9gpu.rules.yaml", "l9gpu-inference.rules.yaml", "l9gpu-chargeback.rules.yaml",
                 "l9gpu-training.rules.yaml"):
        assert (CHART / "files" / name).read_bytes() == (REPO / "alerts" / name).read_bytes(), (
            f"cp alerts/{name} charts/l9gpu/files/")


def test_dashboard_copies_match():
    source = {p.name: p.read_bytes() for p in (REPO / "dashboards").glob("*.json")}
    copies = {p.name: p.read_bytes() for p in (CHART / "dashboards").glob("*.json")}
    assert source and copies == source, "cp dashboards/*.json charts/l9gpu/dashboards/"
    # one ConfigMap holds them all (1 MiB object limit, with room for metadata)
    assert sum(len(b) for b in copies.values()) < 900_000


# --- the plain manifest ----------------------------------------------------------------

def _manifest() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def _without_labels(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("labels", None)
    return obj


def test_plain_manifest_is_the_chart_defaults():
    """deploy/kubernetes holds exactly what the chart renders with its defaults (less Helm's labels)."""
    plain = _manifest()
    assert [doc["kind"] for doc in plain] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                              "Service", "DaemonSet"]
    assert plain[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    rendered = render(namespace=plain[0]["metadata"]["name"])
    by_kind = {obj["kind"]: obj for obj in rendered.objects}
    for doc in plain[1:]:
        assert _without_labels(doc) == _without_labels(by_kind[doc["kind"]]), doc["kind"]
        chart_labels = by_kind[doc["kind"]]["metadata"]["labels"]
        assert doc["metadata"]["labels"].items() <= chart_labels.items(), doc["kind"]
    for version in KUBERNETES_VERSIONS:
        for doc in plain:
            kubernetes_validate.validate(doc, version, strict=True)


def test_plain_manifest_args_start_the_agent(agent_factory):
    """The manifest's arguments, on the simulated node: the agent starts and gets ready."""
    (ds,) = [doc for doc in _manifest() if doc["kind"] == "DaemonSet"]
    args = [a for a in ds["spec"]["template"]["spec"]["containers"][0]["args"]
            if a != "serve" and not a.startswith(("--listen", "--backend"))]
    agent = agent_factory("--backend=simulated", *args, "--pod-label=team")
    samples = agent.samples()
    assert samples["l9gpu_host_pids_visible"]
    assert any(labels.get("label_team") for labels, _ in samples["container_gpu_memory_used_bytes"])


def test_every_flag_in_the_docs_and_unit_exists_in_serve_help():
    result = run_cli(["serve", "--help"])
    assert result.returncode == 0, result.stderr
    known = set(FLAG.findall(result.stdout))
    texts = {path.name: path.read_text() for path in [MANIFEST, CHART / "values.yaml", CHART / "README.md"]}
    texts[UNIT.name] = "\n".join(re.findall(r"^ExecStart=.*$", UNIT.read_text(), re.M))
    for name, text in texts.items():
        unknown = set(FLAG.findall(text)) - known - {"--set", "--namespace", "--create-namespace", "--install"}
        assert not unknown, (name, unknown)


def test_systemd_unit():
    text = UNIT.read_text()
    assert re.search(r"^ExecStart=\S*l9gpu serve --backend auto\b", text, re.M)
    assert re.search(r"^Restart=always$", text, re.M)
    assert not re.search(r"^(ProtectProc|ProcSubset)=", text, re.M), "the agent must see every host process"
    assert re.search(r"^CapabilityBoundingSet=.*CAP_SYS_PTRACE", text, re.M)
    assert re.search(r"^NoNewPrivileges=yes$", text, re.M)
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    check = subprocess.run([analyze, "verify", str(UNIT)], capture_output=True, text=True)
    problems = [line for line in (check.stdout + check.stderr).splitlines()
                if line.strip() and "is not executable" not in line and "No such file" not in line]
    assert not problems, problems


# --- the capabilities the chart grants, against the real Gaudi process scan ------------

_CAPABILITY_DRIVER = r"""
import json, os, stat, subprocess, sys
# a private /dev holding a Gaudi device node's path (a plain file: only the fd link matters)
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/dev"], check=True)
os.mknod("/dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
os.makedirs("/dev/accel")
with open("/dev/accel/accel3", "w"):
    pass
os.chmod("/dev/accel/accel3", 0o666)
hold = "exec 3</dev/accel/accel3; echo ready; exec sleep 600"
holders = {
    "root workload": subprocess.Popen(["sh", "-c", hold], stdout=subprocess.PIPE, text=True),
    "non-root workload": subprocess.Popen(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups",
                                           "sh", "-c", hold], stdout=subprocess.PIPE, text=True),
}
for holder in holders.values():
    assert holder.stdout.readline() == "ready\n"
scan = ("import json; from exporter.devices.gaudi.backend import scan_accel_processes; "
        "print(json.dumps({k: sorted(v) for k, v in scan_accel_processes('/proc').items()}))")
seen = {}
try:
    for name, capabilities in json.loads(sys.argv[1]).items():
        # what a container with `drop: [ALL]` and `add: capabilities` holds, as root
        bounding = ",".join(["-all"] + ["+" + c.lower() for c in capabilities])
        out = subprocess.run(["setpriv", "--bounding-set=" + bounding, "--inh-caps=-all", sys.executable, "-c", scan],
                             capture_output=True, text=True, check=True).stdout
        pids = json.loads(out).get("3", [])
        seen[name] = sorted(who for who, holder in holders.items() if holder.pid in pids)
finally:
    for holder in holders.values():
        holder.kill()
print(json.dumps(seen))
"""


def test_gaudi_capabilities_are_what_the_real_process_scan_needs(releases):
    """The Gaudi scan, run with the capabilities each rendering grants, on processes that
    hold a /dev/accel node open: the gaudi case sees root and non-root workloads, the
    default sees neither, and SYS_PTRACE alone misses other users' processes."""
    import os

    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")):
        pytest.skip("needs root and util-linux setpriv/unshare (a private mount namespace)")

    def added(release: Release) -> list[str]:
        return release.container["securityContext"].get("capabilities", {}).get("add", [])

    grants = {"gaudi": added(releases["backend gaudi"]), "default": added(releases["defaults"]),
              "SYS_PTRACE alone": ["SYS_PTRACE"]}
    assert grants["default"] == []
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                             _CAPABILITY_DRIVER, json.dumps(grants)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"no mount namespaces here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"gaudi": ["non-root workload", "root workload"], "default": [],
                    "SYS_PTRACE alone": ["root workload"]}


def test_detail_trades_series_for_every_family_whole():
    """`detail` and `detailMetrics` reach the agent as --detail and one --detail-metric each."""
    plain = serve_args(render())
    assert plain.detail is False and plain.detail_metric == []
    detailed = serve_args(render(_sets("detail=true", "detailMetrics={gpu_nvlink_errors_total}")))
    assert detailed.detail is True and detailed.detail_metric == ["gpu_nvlink_errors_total"]
