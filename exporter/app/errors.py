"""What the command line tells a user who made a mistake, as one line and an exit status."""

from __future__ import annotations


class UsageError(Exception):
    """A user mistake in flags, environment or files: printed as one line, exit 2."""


class SnapshotTimeout(Exception):
    """`l9gpu snapshot` could read nothing within its --timeout: one line, exit 1."""

