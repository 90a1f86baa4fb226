"""The application: what a user starts and how its parts are put together.

`cli` parses the command line and dispatches (``l9gpu serve``, ``snapshot``, ``report``, ...);
`wiring` builds one agent from the parsed flags (backends, attribution, health, incidents,
sinks); `serve` runs it (the HTTP listener, the pass loop, OTLP, shutdown); `snapshot_cmd`
prints one pass; `logs` sets up logging; `errors` is how a user's mistake ends a command.
Nothing below this floor imports from it.
"""

__all__: list[str] = []
