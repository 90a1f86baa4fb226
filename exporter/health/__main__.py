"""``python -m exporter.health --markdown``: the policy tables for docs/HEALTH.md."""

import sys

from exporter.health.policy import main

sys.exit(main())
