"""The Helm chart, the plain Kubernetes manifest and the systemd unit.

With `helm` on PATH the chart is linted and rendered with several value sets; without it
(it is not a Debian package) the checks that need no template engine still run: values
parse, copies of the rules and dashboards match, every flag passed exists in
`l9gpu serve --help`, every `.Values` path exists, and the plain manifest (the chart's
defaults) is a valid set of Kubernetes objects whose arguments start the real agent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent import run_cli

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "l9gpu"
MANIFEST = REPO / "deploy" / "kubernetes" / "l9gpu-daemonset.yaml"
UNIT = REPO / "deploy" / "systemd" / "l9gpu.service"
TEMPLATES = sorted((CHART / "templates").glob("*"))

FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")


def _values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _manifest() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def _manifest_daemonset() -> dict[str, Any]:
    (ds,) = [doc for doc in _manifest() if doc["kind"] == "DaemonSet"]
    return ds


def _serve_flags() -> set[str]:
    result = run_cli(["serve", "--help"])
    assert result.returncode == 0, result.stderr
    return set(FLAG.findall(result.stdout))


def test_chart_metadata_and_values_parse():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "l9gpu" and chart["type"] == "application"
    from exporter import __version__

    assert chart["appVersion"] == __version__
    values = _values()
    assert values["hostPID"] is True
    assert values["port"] == 9835
    assert values["backend"] == "auto"
    assert {"endpoint", "insecure", "headers", "protocol"} <= values["otlp"].keys()
    assert values["podLabels"] == [] and values["extraArgs"] == []
    assert (CHART / "README.md").read_text().count("helm install") >= 1


def test_rules_copy_matches_the_alerts_file():
    assert (CHART / "files" / "l9gpu.rules.yaml").read_bytes() == (REPO / "alerts" / "l9gpu.rules.yaml").read_bytes(), (
        "cp alerts/l9gpu.rules.yaml charts/l9gpu/files/")


def test_dashboard_copies_match():
    source = {p.name: p.read_bytes() for p in (REPO / "dashboards").glob("*.json")}
    copies = {p.name: p.read_bytes() for p in (CHART / "dashboards").glob("*.json")}
    assert source and copies == source, "cp dashboards/*.json charts/l9gpu/dashboards/"
    # one ConfigMap holds them all
    assert sum(len(b) for b in copies.values()) < 900_000


def test_every_flag_passed_exists_in_serve_help():
    known = _serve_flags()
    used: dict[str, list[str]] = {}
    texts = {path.name: path.read_text() for path in [*TEMPLATES, MANIFEST, CHART / "values.yaml"]}
    texts[UNIT.name] = "\n".join(re.findall(r"^ExecStart=.*$", UNIT.read_text(), re.M))
    for name, text in texts.items():
        for flag in FLAG.findall(text):
            used.setdefault(flag, []).append(name)
    unknown = {flag: where for flag, where in used.items() if flag not in known}
    assert not unknown, unknown
    for flag in ("--backend", "--interval", "--listen", "--proc-root", "--pod-label", "--otlp-endpoint",
                 "--otlp-protocol", "--otlp-insecure"):
        assert flag in used, f"the chart does not pass {flag}"


def _value_paths(tree: Any, prefix: str = "") -> set[str]:
    paths = set()
    if isinstance(tree, dict):
        for key, sub in tree.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            paths |= _value_paths(sub, path)
    return paths


def test_every_values_reference_in_the_templates_exists():
    known = _value_paths(_values())
    for template in TEMPLATES:
        for ref in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            assert ref.rstrip(".") in known, f"{template.name}: .Values.{ref} is not in values.yaml"


def test_template_blocks_are_balanced():
    opening = re.compile(r"\{\{-?\s*(if|with|range|define)\b")
    closing = re.compile(r"\{\{-?\s*end\s*-?\}\}")
    for template in TEMPLATES:
        text = template.read_text()
        assert text.count("{{") == text.count("}}"), template.name
        assert len(opening.findall(text)) == len(closing.findall(text)), template.name


def test_chart_daemonset_template_wiring():
    """What a template engine is not needed to see: the switches reach the right places."""
    text = (CHART / "templates" / "daemonset.yaml").read_text()
    assert re.search(r"hostPID: \{\{ \.Values\.hostPID \}\}", text)
    assert re.search(r"if not \.Values\.hostPID \}\}\s*- --proc-root=/host/proc", text)
    assert "fieldPath: spec.nodeName" in text and "name: NODE_NAME" in text
    assert re.search(r"range \.Values\.podLabels \}\}\s*- --pod-label=\{\{ \. \}\}", text)
    assert re.search(r'if and \.Values\.metricSchema \(ne \.Values\.metricSchema "l9gpu"\) \}\}\s*'
                     r"- --metric-schema=\{\{ \.Values\.metricSchema \}\}", text)
    assert re.search(r"name: OTEL_EXPORTER_OTLP_HEADERS\s+valueFrom:\s+secretKeyRef:", text)
    assert re.search(r"if \.Values\.cri\.enabled \}\}\s*- name: cri-socket", text)
    assert re.search(r"name: pod-resources\s+mountPath: /var/lib/kubelet/pod-resources\s+readOnly: true", text)
    monitor = (CHART / "templates" / "servicemonitor.yaml").read_text()
    assert "honorLabels: true" in monitor and "monitoring.coreos.com/v1" in monitor
    rule = (CHART / "templates" / "prometheusrule.yaml").read_text()
    assert '.Files.Get "files/l9gpu.rules.yaml"' in rule
    role = (CHART / "templates" / "rbac.yaml").read_text()
    assert "verbs: [get, list, watch]" in role and "resources: [pods]" in role


def _round_trip(doc: dict[str, Any]) -> dict[str, Any]:
    """Through the Kubernetes client's models and back: misspelled or misplaced fields vanish."""
    kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client checks the manifest's field names")
    client = kubernetes.client.ApiClient()
    group, _, version = doc["apiVersion"].rpartition("/")
    prefix = "V1" if version == "v1" else version.capitalize()
    model = client._ApiClient__deserialize(doc, f"{prefix}{doc['kind']}")  # noqa: SLF001 - the client's own mapper
    return client.sanitize_for_serialization(model)


def test_plain_manifest_is_valid_kubernetes():
    kinds = [doc["kind"] for doc in _manifest()]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "DaemonSet"]
    for doc in _manifest():
        assert _round_trip(doc) == doc, doc["kind"]


def test_plain_manifest_matches_the_chart_defaults():
    values = _values()
    ds = _manifest_daemonset()
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is values["hostPID"]
    assert pod["tolerations"] == values["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["key"] for t in terms] == values["gpuNodeAffinity"]["labels"]
    assert container["securityContext"] == values["securityContext"]
    assert container["resources"] == values["resources"]
    assert container["livenessProbe"] == values["livenessProbe"]
    assert container["readinessProbe"] == values["readinessProbe"]
    assert container["ports"] == [{"name": "metrics", "containerPort": values["port"], "protocol": "TCP"}]
    assert ds["spec"]["updateStrategy"] == values["updateStrategy"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container["image"] == f"{values['image']['repository']}:{app_version}"
    args = container["args"]
    assert args == ["serve", f"--backend={values['backend']}", f"--interval={values['interval']}",
                    f"--listen=0.0.0.0:{values['port']}", f"--kubernetes={values['kubernetesApi']}",
                    f"--log-level={values['logLevel']}", f"--log-format={values['logFormat']}"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                       "readOnly": True}
    (role,) = [doc for doc in _manifest() if doc["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    (service,) = [doc for doc in _manifest() if doc["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None"


def test_plain_manifest_args_start_the_agent(agent_factory):
    """The manifest's arguments, on the simulated node: the agent starts and gets ready."""
    args = [a for a in _manifest_daemonset()["spec"]["template"]["spec"]["containers"][0]["args"]
            if a != "serve" and not a.startswith(("--listen", "--backend"))]
    agent = agent_factory("--backend=simulated", *args, "--pod-label=team")
    samples = agent.samples()
    assert samples["l9gpu_host_pids_visible"]
    assert any(labels.get("label_team") for labels, _ in samples["container_gpu_memory_used_bytes"])


def test_systemd_unit():
    text = UNIT.read_text()
    assert re.search(r"^ExecStart=\S*l9gpu serve --backend auto\b", text, re.M)
    assert re.search(r"^Restart=always$", text, re.M)
    assert "ProtectProc=invisible" not in text.replace("Not ProtectProc=invisible", "")
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


# --- with helm -------------------------------------------------------------------------

def _helm() -> str:
    helm = shutil.which("helm")
    if helm is None:
        pytest.skip("helm is not installed (no Debian package; install it from helm.sh to render the chart)")
    return helm


def _render(*sets: str) -> dict[str, dict[str, Any]]:
    args = [_helm(), "template", "l9gpu", str(CHART), "--namespace", "gpu-monitoring"]
    for item in sets:
        args += ["--set", item]
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(result.stdout) if d}


def _container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [d for key, d in objects.items() if key.startswith("DaemonSet/")]
    return ds["spec"]["template"]["spec"]["containers"][0]


def test_helm_lint():
    result = subprocess.run([_helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_helm_defaults_equal_the_plain_manifest():
    objects = _render()
    plain = _manifest_daemonset()["spec"]["template"]["spec"]
    (ds,) = [d for key, d in objects.items() if key.startswith("DaemonSet/")]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    container = pod["containers"][0]
    assert container["args"] == plain["containers"][0]["args"]
    assert container["volumeMounts"] == plain["containers"][0]["volumeMounts"]
    assert container["env"] == plain["containers"][0]["env"]
    assert pod["affinity"] == plain["affinity"] and pod["tolerations"] == plain["tolerations"]
    assert not any(key.startswith(("ServiceMonitor/", "PrometheusRule/")) for key in objects)


def test_helm_without_host_pid_mounts_host_proc():
    pod_objects = _render("hostPID=false")
    container = _container(pod_objects)
    assert "--proc-root=/host/proc" in container["args"]
    assert {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True} in container["volumeMounts"]


def test_helm_metric_schema_switches_to_dcgm_names():
    assert "--metric-schema=dcgm" in _container(_render("metricSchema=dcgm"))["args"]
    assert "--metric-schema=l9gpu,dcgm" in _container(_render("metricSchema=l9gpu\\,dcgm"))["args"]
    assert not any(a.startswith("--metric-schema") for a in _container(_render())["args"])


def test_helm_otlp_pod_labels_cri_and_monitoring_objects():
    objects = _render("otlp.endpoint=otel:4317", "otlp.insecure=true", "otlp.protocol=grpc",
                      "otlp.headers.secretName=otlp-auth", "podLabels={team,cost-center}",
                      "cri.enabled=true", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
                      "grafanaDashboards.enabled=true", "extraArgs={--workload-grace,10m}")
    container = _container(objects)
    args = container["args"]
    for arg in ("--otlp-endpoint=otel:4317", "--otlp-protocol=grpc", "--otlp-insecure", "--pod-label=team",
                "--pod-label=cost-center", "--workload-grace", "10m"):
        assert arg in args
    env = {e["name"]: e for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {"name": "otlp-auth", "key": "headers"}
    assert any(m["mountPath"] == "/run/containerd/containerd.sock" for m in container["volumeMounts"])
    rule = next(d for key, d in objects.items() if key.startswith("PrometheusRule/"))
    assert rule["spec"] == yaml.safe_load((REPO / "alerts" / "l9gpu.rules.yaml").read_text())
    monitor = next(d for key, d in objects.items() if key.startswith("ServiceMonitor/"))
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    dashboards = next(d for key, d in objects.items() if key.endswith("-dashboards"))
    assert set(dashboards["data"]) == {p.name for p in (REPO / "dashboards").glob("*.json")}
