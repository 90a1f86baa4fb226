"""``l9gpu inference-rules``: the recording rules and alerts of exporter/inference, written out."""

from __future__ import annotations

import argparse
from typing import Any

from exporter.core.outputs import CommandFailed, check_output, write_output


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``inference-rules`` subcommand to the ``l9gpu`` parser."""
    rules = sub.add_parser("inference-rules",
                           help="write the recording rules and alerts that join inference engines' tokens with "
                                "GPU time",
                           description="Write the Prometheus rules for tokens per second, GPU-seconds, kWh and cost "
                                       "per million tokens per workload and served model, KV-cache saturation and "
                                       "idle replicas, for the built-in engines and those of --engines "
                                       "(alerts/l9gpu-inference.rules.yaml is the built-in engines' file; see "
                                       "docs/INFERENCE.md).")
    rules.add_argument("--engines", metavar="FILE",
                       help="engines to add to, or override in, the built-in mapping (YAML)")
    rules.add_argument("--output", "-o", metavar="FILE", help="write the rules here instead of standard output")
    return rules


def load_engines_or_fail(path: str | None) -> Any:
    """The built-in engine mapping, with ``path``'s engines added (a bad file: one line)."""
    from exporter.inference.engines import EnginesError, load_engines

    try:
        return load_engines(path)
    except EnginesError as exc:
        raise CommandFailed(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Write the rules for the built-in engines and those of ``--engines``; the exit status."""
    from exporter.inference.rules import rules_text

    check_output(args.output)
    engines = load_engines_or_fail(args.engines)
    source = "the built-in engines"
    if args.engines:  # into a comment line of the rule file: no line breaks or control characters
        source += " and " + "".join(c if c.isprintable() else "?" for c in args.engines)
    write_output(args.output, rules_text(engines, source))
    return 0
