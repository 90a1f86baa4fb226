"""What a command that writes a file or standard output shares: a failure as one line, and
writing the output whole or not at all."""

from __future__ import annotations

import os
import sys
from pathlib import Path


class CommandFailed(Exception):
    """A command's failure, printed as ``l9gpu <command>: <message>`` with ``status``."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def write_output(path: str | None, text: str) -> None:
    """Write ``text`` to ``path`` (standard output for none or ``-``), whole or not at all."""
    if not path or path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise CommandFailed(f"cannot write {path}: {exc.strerror or exc}") from None


def check_output(path: str | None) -> None:
    """Fail before any work when ``path``'s directory does not exist or is not writable."""
    if not path or path == "-":
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise CommandFailed(f"--output {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CommandFailed(f"--output {path}: cannot write in {parent}")
