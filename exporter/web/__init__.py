"""The web wing: what the agent serves over HTTP, and what it refuses.

One concept per module, as aiohttp splits ``web_app``, ``web_protocol``, ``web_runner``:

* `app` builds the aiohttp application and its routes (/metrics, /healthz, /readyz, /,
  /api/v1/snapshot);
* `exposition` renders /metrics bytes (content negotiation, gzip, once per snapshot), and
  `forecast` says when each scraper's next scrape is due, so they are rendered ahead;
* `page` (with its template ``page.html``) renders the page at / and its JSON;
* the web config (``--web-config``): `webconfig` its format, `tls` its TLS contexts,
  `auth` its basic auth, `ratelimit` its rate limit, `access` the middleware that applies
  them to each request, `watcher` the file read at start and re-read on change;
* the listener: `limits` what a client may make the agent hold, `descriptors` the
  open-file limit and the connections it leaves room for, `guard` the connection guard,
  `site` the aiohttp site that listens through it, `logs` their throttled log lines.

What the listener and the web config refuse is counted in `exporter.output.counts.Rejections`.
"""

__all__: list[str] = []  # the public names live in the modules the docstring names
