"""Shared types and small rules every floor uses, importing nothing else of the agent's.

`model` (the snapshot and its rows), `labels` (how a row becomes label values), `bulkhead`
(a deadline on every read), `shares` (which per-process reads a pass makes and the shares
carried between them), `process_groups`, `parsing` (users' values: durations, addresses) and
`escape` (untrusted text made safe for each sink) and `outputs` (a command's output written
whole or not at all).
"""

__all__: list[str] = []
