"""Untrusted text made safe for each place it is written to.

Process names, pod and container names, pod labels and Slurm fields are chosen by the
users of a node, and a Prometheus server's answers by whoever runs it. They are data,
never control, so every sink gets its own escaping:

- a terminal (`for_terminal`): control characters would move the cursor, clear the
  screen or retitle the window (``ESC ] 0 ; ... BEL``), and bidirectional overrides
  would reorder what the operator reads; they are shown as visible escapes instead, as
  kubectl does since CVE-2021-25743;
- a spreadsheet (`for_spreadsheet`): a CSV cell that starts with ``=``, ``+``, ``-``,
  ``@``, TAB or CR is a formula to Excel, LibreOffice and Google Sheets; OWASP's
  recommendation is a leading ``'``, which makes the cell text;
- JSON (`strict_json`): Python writes NaN and infinities as ``NaN``/``Infinity``, which
  no JSON parser but Python's and JavaScript's ``eval`` accepts; they become ``null``.
  JSON written with readable non-ASCII letters keeps no raw C1 or bidirectional control
  either (`json_for_terminal`), as it is often printed to a terminal.

HTML is escaped where pages are rendered (Jinja2's autoescape, ``html.escape``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# C0 controls, DEL, C1 controls (U+0080-U+009F: U+009B is CSI on 8-bit terminals), the
# line and paragraph separators, and the bidirectional embeddings, overrides and
# isolates (the "Trojan Source" characters).
_TERMINAL_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: str) -> str:
    """``text`` with every character that could control a terminal written as a visible
    escape (``\\x1b``, ``\\x07``, ``\\u202e``); everything else, backslashes and non-ASCII
    letters included, is unchanged.

    Tabs and newlines are escaped too: a table line stays one line, aligned.
    """
    if _TERMINAL_UNSAFE.search(text) is None:  # the common case: no copy
        return text
    return _TERMINAL_UNSAFE.sub(_visible, text)


# OWASP "CSV Injection": the characters a spreadsheet reads as the start of a formula.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def for_spreadsheet(text: str) -> str:
    """A CSV text cell that no spreadsheet runs as a formula: ``'`` before one that
    starts with ``=``, ``+``, ``-``, ``@``, TAB or CR (the spreadsheet shows the ``'`` or
    hides it, and keeps the rest as text). Other text is unchanged."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float, however deep in dicts, lists and
    tuples, replaced by None (a new structure where something changed)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# What ``json.dumps(..., ensure_ascii=False)`` leaves raw that a terminal may still act on.
_JSON_RAW_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def json_for_terminal(text: str) -> str:
    """JSON text written with ``ensure_ascii=False`` (readable non-ASCII names) with DEL,
    the C1 controls, the line separators and the bidirectional controls as ``\\uXXXX``
    escapes. The JSON means exactly the same: these characters only occur inside
    strings, where an escape stands for the character itself (JSON already escapes C0)."""
    if _JSON_RAW_UNSAFE.search(text) is None:
        return text
    return _JSON_RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def strict_json(doc: Any, **kwargs: Any) -> str:
    """``json.dumps(doc, **kwargs)`` that is always valid JSON: NaN and infinities are
    written as ``null``.

    Documents without them, the usual case, are encoded once, as fast as
    ``json.dumps``; only a document that holds one is walked and encoded again.
    """
    try:
        return json.dumps(doc, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(finite(doc), allow_nan=False, **kwargs)
