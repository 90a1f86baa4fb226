"""CPU time of one /metrics encoding of the busy node, and against an earlier encoder.

The busy node of bench_agent.py (8 GPUs, 64 containers, 256 processes), one snapshot,
the families the agent's registry yields for ``--metric-schema l9gpu`` and
``l9gpu,dcgm``, encoded by `exporter.output.encode.Encoder` as a scrape gets them: the text
format and OpenMetrics (where /metrics first adapts the families with
`exporter.output.encode.for_openmetrics`). With ``--against REV`` the encoder of that git
revision (its ``exporter/output/encode.py``) encodes the same families in alternation with the
working tree's, so that both see the same machine load, and the ratio of the medians is
printed; the working tree's bytes are checked against prometheus_client's.

Run: ``python benchmarks/bench_encode.py --against HEAD~1`` (``--renders`` for the sample size).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

FORMATS = ("text/plain;version=0.0.4", "application/openmetrics-text;version=1.0.0")


def encoder_at(revision: str, workdir: Path) -> ModuleType:
    """``exporter/output/encode.py`` as of ``revision``, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:exporter/output/encode.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = workdir / "encode_at_revision.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("encode_at_revision", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render(encoder, families: list, adapt: bool) -> bytes:  # type: ignore[no-untyped-def]
    """One /metrics body: ``families`` adapted for OpenMetrics first when ``adapt``."""
    from exporter.output.encode import for_openmetrics

    return encoder.encode(for_openmetrics(families, encoder.escaping) if adapt else families)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=300)
    parser.add_argument("--against", metavar="REV", help="also time the encoder of this git revision")
    opts = parser.parse_args()
    logging.disable(logging.INFO)
    from bench_agent import scenario
    from bench_dcgm import registry_for, snapshot_of
    from prometheus_client.exposition import choose_encoder

    from exporter.output import encode

    with tempfile.TemporaryDirectory() as tmp:
        snapshot, extra = snapshot_of(str(scenario(Path(tmp) / "busy.yaml")))
        other = encoder_at(opts.against, Path(tmp)) if opts.against else None
    print(f"busy node: {len(snapshot.devices)} GPUs, {len(snapshot.workloads)} workload rows, "
          f"{len(snapshot.processes)} processes; median CPU time of one encoding (n={opts.renders})")
    for schema in ("l9gpu", "l9gpu,dcgm"):
        families = list(registry_for(schema, snapshot, extra).collect())
        for accept in FORMATS:
            library, _ = choose_encoder(accept)
            encoders = {"working tree": encode.Encoder(library)}
            if other is not None:
                encoders[opts.against] = other.Encoder(library)
            openmetrics = "openmetrics" in accept
            current = encoders["working tree"]
            # what /metrics encodes: the working tree adapts the families for OpenMetrics
            # (counted in its time), the earlier revision took them as they were
            adapted = {name: openmetrics and name == "working tree" for name in encoders}
            served = list(encode.for_openmetrics(families, current.escaping)) if openmetrics else families
            assert render(current, families, openmetrics) == library(encode._Families(served))
            times: dict[str, list[float]] = {name: [] for name in encoders}
            gc.collect()
            for i in range(opts.renders):
                for name in (list(encoders) if i % 2 else list(reversed(encoders))):
                    started = time.thread_time()
                    render(encoders[name], families, adapted[name])
                    times[name].append(time.thread_time() - started)
            medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            line = "  ".join(f"{name} {ms:5.2f} ms" for name, ms in medians.items())
            if other is not None:
                line += f"  ratio {medians['working tree'] / medians[opts.against]:.3f}"
            print(f"  {schema:<11} {accept.split(';')[0]:<29} {line}", flush=True)


if __name__ == "__main__":
    main()
