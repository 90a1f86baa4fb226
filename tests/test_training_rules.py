"""The training-job rules (alerts/l9gpu-training.rules.yaml): every rule and alert has a unit test in
tests/training_rules_test.yaml (which promtool runs beside the other rule files' in
tests/test_prometheus.py), holding a hung job and its suspects, hardware
stragglers against the job's median, the hourly figures per job, and the cases that must not
fire: a checkpoint, a one-GPU job, a job whose pods restart, a job of two GPU models."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "l9gpu-training.rules.yaml"


def test_every_training_rule_and_alert_is_unit_tested():
    """Each record and alert of the file is asked for by name in the unit tests (a record that
    only feeds another is asked for through what it feeds, so it is named here explicitly)."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    names = {rule.get("record") or rule["alert"] for group in groups for rule in group["rules"]}
    tests = (REPO / "tests" / "training_rules_test.yaml").read_text()
    # inputs of the straggler and utilisation records, tested through them
    fed = {"job_rank_gpu:l9gpu_training_stalled:max", "model:l9gpu_gpu_sm_clock_hertz:max",
           "gpu:l9gpu_training_utilization:avg10m",
           "job_rank_gpu:l9gpu_training_sm_clock_hertz:avg10m", "job_rank_gpu:l9gpu_training_temperature_celsius:avg10m",
           "job_rank_gpu:l9gpu_training_throttled:ratio10m", "job_rank_gpu:l9gpu_training_pcie_link:ratio",
           "job_rank_gpu:l9gpu_training_link_errors:rate10m"}
    untested = sorted(name for name in names - fed if name not in tests)
    assert not untested, untested
