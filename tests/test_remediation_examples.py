"""The remediation examples of docs/HEALTH.md (deploy/remediation/) match the node condition
the agent writes, and the fields their controllers' published CRD schemas ask for.

The schemas below are the parts of the CRDs' ``openAPIV3Schema`` that the examples use:
Cluster API's ``machinehealthchecks.cluster.x-k8s.io`` (v1beta1) and medik8s'
``nodehealthchecks.remediation.medik8s.io`` (v1alpha1): required fields, types, and the
patterns of durations and percentages, with no other field allowed where the CRD has none.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the examples")

from exporter.nodestatus.condition import DEFAULT_CONDITION_TYPE  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "deploy" / "remediation"

_SELECTOR = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "required": ["key", "operator"], "additionalProperties": False,
            "properties": {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": {"type": "array", "items": {"type": "string"}}}}},
    },
}
_GO_DURATION = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
_OBJECT_REFERENCE = {
    "type": "object", "additionalProperties": False,
    "properties": {key: {"type": "string"} for key in
                   ("apiVersion", "kind", "name", "namespace", "uid", "resourceVersion", "fieldPath")},
}
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}}

MACHINE_HEALTH_CHECK = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cluster.x-k8s.io/v1beta1"}, "kind": {"const": "MachineHealthCheck"},
        "metadata": {**_METADATA, "required": ["name", "namespace"]},
        "spec": {
            "type": "object", "required": ["clusterName", "selector"], "additionalProperties": False,
            "properties": {
                "clusterName": {"type": "string", "minLength": 1},
                "selector": _SELECTOR,
                "maxUnhealthy": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^\d+%?$"}]},
                "unhealthyRange": {"type": "string", "pattern": r"^\[[0-9]+-[0-9]+\]$"},
                "nodeStartupTimeout": {"type": "string", "pattern": _GO_DURATION},
                "remediationTemplate": _OBJECT_REFERENCE,
                "unhealthyConditions": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["type", "status", "timeout"], "additionalProperties": False,
                    "properties": {"type": {"type": "string", "minLength": 1},
                                   "status": {"type": "string", "minLength": 1},
                                   "timeout": {"type": "string", "pattern": _GO_DURATION}}}},
            },
        },
    },
}

NODE_HEALTH_CHECK = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "remediation.medik8s.io/v1alpha1"}, "kind": {"const": "NodeHealthCheck"},
        "metadata": _METADATA,
        "spec": {
            "type": "object", "required": ["selector"], "additionalProperties": False,
            "properties": {
                "selector": _SELECTOR,
                "minHealthy": {"anyOf": [{"type": "integer", "minimum": 0},
                                         {"type": "string", "pattern": r"^((100|[0-9]{1,2})%|[0-9]+)$"}]},
                "pauseRequests": {"type": "array", "items": {"type": "string"}},
                "remediationTemplate": _OBJECT_REFERENCE,
                "escalatingRemediations": {"type": "array"},
                "unhealthyConditions": {"type": "array", "items": {
                    "type": "object", "required": ["type", "status", "duration"], "additionalProperties": False,
                    "properties": {"type": {"type": "string", "minLength": 1},
                                   "status": {"type": "string", "minLength": 1},
                                   "duration": {"type": "string", "pattern": _GO_DURATION}}}},
            },
            "not": {"required": ["remediationTemplate", "escalatingRemediations"]},  # mutually exclusive
        },
    },
}


def _load(name: str) -> dict[str, Any]:
    [doc] = list(yaml.safe_load_all((EXAMPLES / name).read_text()))
    return doc


@pytest.mark.parametrize(("name", "schema"), [("machinehealthcheck.yaml", MACHINE_HEALTH_CHECK),
                                              ("nodehealthcheck.yaml", NODE_HEALTH_CHECK)])
def test_the_examples_validate_and_match_on_the_agents_condition(name: str, schema: dict[str, Any]) -> None:
    doc = _load(name)
    jsonschema.validate(doc, schema)
    conditions = doc["spec"]["unhealthyConditions"]
    ours = [c for c in conditions if c["type"] == DEFAULT_CONDITION_TYPE]
    assert [c["status"] for c in ours] == ["True"]  # node-problem-detector's convention: True is the problem
    # the kubelet's Ready checks kept beside it (NodeHealthCheck's list replaces its defaults)
    assert {(c["type"], c["status"]) for c in conditions} >= {("Ready", "False"), ("Ready", "Unknown")}
    # a status is a string: YAML's bare True/False would be booleans, which the CRDs refuse
    assert all(isinstance(c["status"], str) for c in conditions)


def test_a_bare_yaml_true_status_is_refused() -> None:
    doc = _load("nodehealthcheck.yaml")
    doc["spec"]["unhealthyConditions"][-1]["status"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, NODE_HEALTH_CHECK)


def test_the_docs_show_the_examples() -> None:
    text = (REPO / "docs" / "HEALTH.md").read_text()
    for name in ("machinehealthcheck.yaml", "nodehealthcheck.yaml"):
        assert f"deploy/remediation/{name}" in text
    assert re.search(r"type: GPUUnhealthy\s+status: \"True\"", text)
