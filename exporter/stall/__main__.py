"""``python -m exporter.stall --markdown``: docs/TRAINING.md's threshold table."""

from __future__ import annotations

import sys

from exporter.stall.policy import markdown

if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m exporter.stall --markdown")
    sys.stdout.write(markdown())
