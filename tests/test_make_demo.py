"""`make demo`, `make demo-incidents` and `make demo-training` serve on loopback unless LISTEN says otherwise."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _listen(target: str, *overrides: str) -> list[str]:
    """The --listen addresses of the commands `make -n TARGET` would run (nothing runs)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(["make", "-n", "-C", str(REPO), target, *overrides], capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0, dry.stderr
    return re.findall(r"l9gpu serve .*--listen (\S+)", dry.stdout)


@pytest.mark.parametrize("target", ["demo", "demo-incidents", "demo-training"])
def test_the_demo_listens_on_loopback_by_default(target: str) -> None:
    assert _listen(target) == ["127.0.0.1:9835"]


@pytest.mark.parametrize("target", ["demo", "demo-incidents", "demo-training"])
def test_listen_serves_the_demo_elsewhere_when_asked(target: str) -> None:
    assert _listen(target, "LISTEN=0.0.0.0:9900") == ["0.0.0.0:9900"]


def test_the_training_fleet_demo_puts_prometheus_on_listen_and_the_agents_after_it() -> None:
    """`make demo-training-fleet` runs deploy/demo/training_fleet.py with LISTEN (Prometheus'
    address; the agents take the next ports)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for overrides, address in (((), "127.0.0.1:9835"), (("LISTEN=0.0.0.0:9900",), "0.0.0.0:9900")):
        dry = subprocess.run(["make", "-n", "-C", str(REPO), "demo-training-fleet", *overrides], capture_output=True,
                             text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert re.findall(r"deploy/demo/training_fleet\.py --listen (\S+)", dry.stdout) == [address]
