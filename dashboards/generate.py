"""Build the Grafana dashboards in this directory and the Helm chart's copies of them.

    python dashboards/generate.py          # rewrite dashboards/l9gpu-*.json and charts/l9gpu/dashboards/
    python dashboards/generate.py --check  # exit 1 if a committed file differs

The JSON files are committed so they can be imported as they are (Grafana UI, a
provisioning directory, or a ConfigMap with the Grafana sidecar's label); the panels are
written with Grafana's dashboards-as-code SDK (grafana-foundation-sdk, the `test` extra) in
dashboards/devices.py, dashboards/workloads.py and dashboards/training.py, and every file is checked against the
schema the SDK ships (dashboards/schema.py) before it is written. tests/test_dashboards.py
evaluates every expression against a real Prometheus scraping the agent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script: `dashboards` is a package of the checkout
    sys.path.insert(0, str(REPO))

from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models.dashboard import Dashboard  # noqa: E402

from dashboards import schema  # noqa: E402
from dashboards.devices import devices  # noqa: E402
from dashboards.training import training  # noqa: E402
from dashboards.workloads import workloads  # noqa: E402

DASHBOARDS: dict[str, Callable[[], Dashboard]] = {"l9gpu-workloads.json": workloads, "l9gpu-devices.json": devices,
                                                  "l9gpu-training.json": training}
# Where each file goes: the repository's dashboards/ and the chart's copy its ConfigMap serves.
DESTINATIONS = (HERE, REPO / "charts" / "l9gpu" / "dashboards")


def render(build: Callable[[], Dashboard]) -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    stale: list[str] = []
    invalid: list[str] = []
    for name, build in DASHBOARDS.items():
        text = render(build)
        invalid.extend(f"{name}: {problem}" for problem in schema.problems(json.loads(text)))
        for folder in DESTINATIONS:
            path = folder / name
            if "--check" in argv:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path.relative_to(REPO)))
            elif not invalid:
                path.write_text(text)
    if invalid:
        print("not valid for Grafana:\n  " + "\n  ".join(invalid), file=sys.stderr)
        return 1
    if stale:
        print(f"out of date (run python dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
