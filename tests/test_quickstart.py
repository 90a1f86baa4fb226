"""The README's "Install on a cluster" quick start, followed command by command.

Its code blocks are read out of README.md and each command is checked against what it
acts on: the namespace label against the install's namespace, the image build against the
Dockerfile (its stages and the paths it copies) and the chart's appVersion, the
`helm install` and `helm upgrade` lines rendered by Helm's own engine (helm-python-sdk, as
tests/test_chart.py renders the chart) with their --set values and validated object by
object against the Kubernetes API schemas (kubernetes-validate), and the "did it work?"
commands against the rendered objects and the metric catalogue.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk renders the chart (pip install '.[test]' in l9gpu's checkout)")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate checks rendered objects")

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "l9gpu"
OLDEST_KUBERNETES = "1.25"


def quickstart() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Install on a cluster")
    return text[start:text.index("\n## ", start + 1)]


def commands() -> list[list[str]]:
    """Every command of the quick start's code blocks, as shell words, in order."""
    found = []
    for block in re.findall(r"^ *```bash\n(.*?)^ *```", quickstart(), re.M | re.S):
        text = re.sub(r"\\\n\s*", " ", block)  # a backslash-newline continues the line
        for line in text.splitlines():
            line = line.split(" #")[0].strip()
            if line:
                found.append(shlex.split(line))
    return found


def the(prefix: list[str], which: int = 0) -> list[str]:
    matching = [c for c in commands() if c[:len(prefix)] == prefix]
    assert len(matching) > which, f"the quick start has no `{' '.join(prefix)}` command"
    return matching[which]


def option(words: list[str], *names: str) -> list[str]:
    values = []
    for i, word in enumerate(words):
        if word in names:
            values.append(words[i + 1])
        for name in names:
            if word.startswith(name + "="):
                values.append(word.split("=", 1)[1])
    return values


def helm_values(words: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for expression in option(words, "--set"):
        parsed = helm.parse_set_string(expression)
        for key, value in parsed.items():
            if isinstance(value, dict) and isinstance(values.get(key), dict):
                values[key].update(value)
            else:
                values[key] = value
    return values


def render(values: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    manifests = helm.Chart.load(CHART).render(values, name="l9gpu", namespace=namespace, is_install=True)
    manifests.pop("l9gpu/templates/NOTES.txt", None)
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


def validate(objects: list[dict[str, Any]]) -> None:
    for version in (OLDEST_KUBERNETES, kubernetes_validate.latest_version()):
        for obj in objects:
            if obj["apiVersion"].startswith("monitoring.coreos.com/"):
                # a custom resource: kubernetes-validate knows only its metadata's schema
                obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on {version}: "
                            f"{'.'.join(map(str, exc.path))}: {exc.message}")


def install() -> tuple[str, str, dict[str, Any]]:
    words = the(["helm", "install"])
    positional, rest = [], iter(words[2:])
    for word in rest:
        if word in ("-n", "--namespace", "--set"):
            next(rest)
        elif not word.startswith("-"):
            positional.append(word)
    release, chart = positional
    (namespace,) = option(words, "-n", "--namespace")
    return release, namespace, helm_values(words) | {"_chart": chart}


def test_the_namespace_is_labelled_for_pod_security_before_the_install():
    cmds = commands()
    release, namespace, _ = install()
    label = the(["kubectl", "label", "namespace"])
    assert label[3] == namespace == "l9gpu"
    assert label[4:] == ["pod-security.kubernetes.io/enforce=privileged"]
    assert cmds.index(label) < cmds.index(the(["helm", "install"])), "label the namespace before installing"
    assert the(["kubectl", "create", "namespace"])[3] == namespace


def test_the_image_build_matches_the_dockerfile_and_the_chart():
    build, push = the(["docker", "build"]), the(["docker", "push"])
    (tag,) = option(build, "-t", "--tag")
    assert build[-1] == ".", "built from the repository root, where the Dockerfile is"
    dockerfile = REPO / "Dockerfile"
    assert dockerfile.is_file()
    lines = [line.strip() for line in dockerfile.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert any(line.startswith("FROM ") for line in lines)
    for line in lines:
        if line.startswith("COPY ") and "--from=" not in line:  # --from: another stage's files, not the checkout's
            sources = [w for w in shlex.split(line)[1:-1] if not w.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), f"the Dockerfile copies {source}, which the checkout lacks"
    entrypoint = [line for line in lines if line.startswith("ENTRYPOINT")]
    assert entrypoint and '"l9gpu"' in entrypoint[0], "the chart runs the image's l9gpu entrypoint"
    repository, version = tag.rsplit(":", 1)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert version == chart["appVersion"], "the tag the chart pulls when image.tag is empty"
    assert push[2] == tag
    _, _, values = install()
    assert values["image"]["repository"] == repository


def test_the_install_renders_valid_objects_with_the_readme_image():
    release, namespace, values = install()
    assert values.pop("_chart") == "./charts/l9gpu"
    assert "--create-namespace" in the(["helm", "install"])
    objects = render(values, namespace)
    validate(objects)
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    assert daemonset["metadata"]["namespace"] == namespace
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"REGISTRY/l9gpu:{chart['appVersion']}"
    assert daemonset["spec"]["template"]["spec"]["hostPID"] is True


def test_the_checks_name_what_the_install_created():
    release, namespace, values = install()
    values.pop("_chart")
    objects = render(values, namespace)
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    port = daemonset["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    forward = the(["kubectl", "-n", namespace, "port-forward"])
    assert forward[4] == f"ds/{daemonset['metadata']['name']}" and forward[5] == str(port)
    assert the(["kubectl", "-n", namespace, "rollout", "status"])[5] == f"ds/{daemonset['metadata']['name']}"
    curl = the(["curl"])
    assert f"localhost:{port}/metrics" in curl
    from exporter.output.catalogue import BY_NAME

    for metric in ("gpu_up", "l9gpu_host_pids_visible"):
        assert metric in BY_NAME and metric in " ".join(curl)
    # the failures table's advice names values the chart has
    text = quickstart()
    for value in re.findall(r"--set ([\w.]+)=", text):
        node: Any = yaml.safe_load((CHART / "values.yaml").read_text())
        for part in value.split("."):
            assert isinstance(node, dict) and part in node or node == {}, value
            node = node.get(part, {}) if isinstance(node, dict) else {}
    assert "no GPU backend found" in text
    assert "no GPU backend found" in (REPO / "exporter" / "devices" / "__init__.py").read_text()


def test_turning_on_the_operator_objects_renders_them():
    upgrade = the(["helm", "upgrade", "--install"])
    (namespace,) = option(upgrade, "-n", "--namespace")
    assert namespace == install()[1]
    values = helm_values(upgrade)
    assert values["serviceMonitor"]["enabled"] is True and values["prometheusRule"]["enabled"] is True
    assert values["grafanaDashboards"]["enabled"] is True
    objects = render(values, namespace)
    validate(objects)
    kinds = {o["kind"] for o in objects}
    assert {"ServiceMonitor", "PrometheusRule", "ConfigMap", "DaemonSet"} <= kinds
