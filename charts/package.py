"""Package the l9gpu chart as a static Helm repository (``make chart``).

Writes ``<dest>/l9gpu-<version>.tgz`` and ``<dest>/index.yaml`` with Helm's own Go engine
(PyPI ``helm-python-sdk``): the chart is linted strictly first, then packaged, and the
index lists every archive in ``dest``. Serve the folder over HTTP(S) and::

    helm repo add l9gpu <URL of the folder>
    helm install l9gpu l9gpu/l9gpu -n monitoring ...

Usage: ``python charts/package.py [DEST] [--url URL]``. Without ``--url`` the index's
archive URLs are relative, so the folder can be served from anywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

CHART = Path(__file__).resolve().parent / "l9gpu"
DEFAULT_DEST = Path(__file__).resolve().parent.parent / "dist" / "charts"

# helm_python.lint severities: 1 info, 2 warning, 3 error; `--strict` fails on warnings.
_WARNING = 2


class PackagingError(Exception):
    """The chart does not lint or package; the message says why."""


def package_chart(dest: Path, url: str | None = None, chart: Path = CHART) -> tuple[Path, dict[str, Any]]:
    """Lint, package and index the chart.

    Args:
        dest: folder of the Helm repository (created if missing).
        url: absolute URL the folder is served at, for absolute archive URLs in the index.
        chart: the chart directory.

    Returns:
        The archive's path and the repository index (as written to ``dest/index.yaml``).

    Raises:
        PackagingError: lint findings of warning level or above, or a packaging failure.
    """
    try:
        import helm_python
    except ImportError as exc:  # an optional test/release dependency
        raise PackagingError(f"helm-python-sdk is needed to package the chart ({exc}); "
                             "pip install '.[test]' in l9gpu's checkout") from None
    report = helm_python.lint(chart, strict=True)
    problems = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= _WARNING]
    problems += report.get("errors") or []
    if problems:
        raise PackagingError("helm lint: " + "; ".join(problems))
    dest.mkdir(parents=True, exist_ok=True)
    try:
        archive = Path(helm_python.package(chart, destination=dest))
        index = helm_python.repo_index_generate(dest, base_url=url)
    except helm_python.HelmError as exc:
        raise PackagingError(str(exc)) from None
    return archive, index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Package the l9gpu chart and write a Helm repository index.")
    parser.add_argument("dest", nargs="?", type=Path, default=DEFAULT_DEST,
                        help="repository folder (default: dist/charts)")
    parser.add_argument("--url", help="absolute URL the folder is served at (default: relative archive URLs)")
    args = parser.parse_args(argv)
    try:
        archive, index = package_chart(args.dest, args.url)
    except PackagingError as exc:
        print(f"chart: {exc}", file=sys.stderr)
        return 2
    versions = ", ".join(entry["version"] for entry in index["entries"]["l9gpu"])
    print(f"chart: {archive} and {args.dest / 'index.yaml'} (l9gpu {versions})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
